"""The network a Docker sandbox with `spec.network=True` joins: the project's own
bridge, egress only. Never the host's network namespace.

`ensure_egress_network()` creates (once) the user-defined bridge network
`vf-sandbox-egress` on the Linux bridge `vfsbx0` (inter-container traffic
off) and installs its firewall on the engine's host, idempotently:

    filter INPUT    -i vfsbx0 -j DROP                  nothing from a sandbox reaches the host itself
                                                        (any of its addresses, the gateway, loopback services)
    filter FORWARD  -i vfsbx0 -o vfsbx0 -j DROP        sandboxes cannot reach each other
                    -i vfsbx0 -d <nameserver> -j ACCEPT the host's resolvers (DNS keeps working)
                    -i vfsbx0 -d 10/8,172.16/12,192.168/16,169.254/16,100.64/10 -j DROP
                                                        no private networks, no cloud metadata
                    -i vfsbx0 -j ACCEPT / -o vfsbx0 ESTABLISHED -j ACCEPT   the internet
    nat POSTROUTING -s <subnet> ! -o vfsbx0 -j MASQUERADE

(also when the engine itself runs with `--iptables=false`, as `scripts/setup.sh`
starts it). The firewall needs root and `iptables` on the engine's host, so the
engine must be local (a unix socket). Where that is impossible the sandbox is
refused with a ConfigError saying what to do (pass `network_mode=` naming a
network you isolated yourself) — never silently given host networking.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import os
import shutil
import subprocess
from typing import Any

from sandboxes.errors import ConfigError

NETWORK = "vf-sandbox-egress"
BRIDGE = "vfsbx0"
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10")
REFUSED_MODES = ("host",)


def check_network_mode(mode: str) -> None:
    """Refuse network modes that share a namespace with the host or another container."""
    if mode in REFUSED_MODES or mode.startswith("container:"):
        raise ConfigError(
            f"network_mode={mode!r} would share the host's (or another container's) network namespace with "
            f"model-written code; vf-sandbox never does that. Leave network_mode unset (the project's "
            f"egress-only network {NETWORK!r}) or name a network you isolated yourself")


def nameservers(resolv: str = "/etc/resolv.conf") -> list[str]:
    """The host's IPv4 resolvers (sandbox DNS is forwarded to them)."""
    out = []
    try:
        with open(resolv) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    try:
                        if ipaddress.ip_address(parts[1]).version == 4 and not ipaddress.ip_address(parts[1]).is_loopback:
                            out.append(parts[1])
                    except ValueError:
                        continue
    except OSError:
        pass
    return out


def firewall_rules(subnet: str, resolvers: list[str]) -> list[tuple[str, str, list[str]]]:
    """(table, chain, rule) of the egress-only firewall, in the order they must match."""
    rules: list[tuple[str, str, list[str]]] = [("filter", "INPUT", ["-i", BRIDGE, "-j", "DROP"])]
    fwd = [["-i", BRIDGE, "-o", BRIDGE, "-j", "DROP"]]
    fwd += [["-i", BRIDGE, "-d", ns, "-p", proto, "--dport", "53", "-j", "ACCEPT"] for ns in resolvers for proto in ("udp", "tcp")]
    fwd += [["-i", BRIDGE, "-d", net, "-j", "DROP"] for net in PRIVATE]
    fwd += [["-i", BRIDGE, "-j", "ACCEPT"], ["-o", BRIDGE, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]]
    rules += [("filter", "FORWARD", r) for r in fwd]
    rules.append(("nat", "POSTROUTING", ["-s", subnet, "!", "-o", BRIDGE, "-j", "MASQUERADE"]))
    return rules


def firewall_problem(url: str) -> str | None:
    """Why this process cannot install the firewall for the engine at `url` (None: it can)."""
    if not url.startswith("unix://"):
        return f"the engine at {url} is remote: its host's firewall cannot be set from here"
    if os.geteuid() != 0:
        return "installing the firewall needs root"
    if shutil.which("iptables") is None:
        return "iptables is not installed"
    return None


def apply_firewall(subnet: str) -> None:
    """Install the rules that are missing (each checked with -C first); idempotent.

    Rules of one chain are inserted in reverse at position 1 so that they end up
    first and in order, ahead of whatever else the host has."""
    with open("/run/vf-sandbox-firewall.lock", "a") as lock:  # one installer at a time, across processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        _apply_locked(subnet)


def _apply_locked(subnet: str) -> None:
    by_chain: dict[tuple[str, str], list[list[str]]] = {}
    for table, chain, rule in firewall_rules(subnet, nameservers()):
        by_chain.setdefault((table, chain), []).append(rule)
    for (table, chain), rules in by_chain.items():
        missing = [r for r in rules if subprocess.run(["iptables", "-w", "-t", table, "-C", chain, *r],
                                                      capture_output=True).returncode != 0]
        if not missing:
            continue
        # re-insert the whole chain block in order so that a partial earlier install stays ordered
        for rule in rules:
            while subprocess.run(["iptables", "-w", "-t", table, "-D", chain, *rule], capture_output=True).returncode == 0:
                pass
        for rule in reversed(rules):
            proc = subprocess.run(["iptables", "-w", "-t", table, "-I", chain, "1", *rule], capture_output=True, text=True)
            if proc.returncode != 0:
                raise ConfigError(f"cannot install the sandbox network firewall ({' '.join(rule)}): {proc.stderr.strip()}")
    try:
        with open("/proc/sys/net/ipv4/ip_forward") as fh:
            forwarding = fh.read().strip() == "1"
        if not forwarding:
            with open("/proc/sys/net/ipv4/ip_forward", "w") as fh:
                fh.write("1")
    except OSError as exc:
        raise ConfigError(f"cannot enable IPv4 forwarding for the sandbox network: {exc}") from None


async def ensure_egress_network(docker: Any, url: str) -> str:
    """Create (if missing) the project's egress-only network and its firewall; returns its name.

    Raises ConfigError when the firewall cannot be installed (the network would
    then let a sandbox reach the host)."""
    import aiodocker

    problem = firewall_problem(url)
    if problem:
        raise ConfigError(
            f"network=True needs the egress-only sandbox network, and {problem}. Run as root on the engine's "
            f"host, or give the backend network_mode=<a network you isolated yourself> (never 'host').")
    try:
        net = await docker.networks.get(NETWORK)
        info = await net.show()
    except aiodocker.DockerError as exc:
        if exc.status != 404:
            raise
        config = {
            "Name": NETWORK, "Driver": "bridge", "CheckDuplicate": True, "Internal": False, "EnableIPv6": False,
            "Options": {"com.docker.network.bridge.name": BRIDGE, "com.docker.network.bridge.enable_icc": "false",
                        "com.docker.network.bridge.enable_ip_masquerade": "true"},
            "Labels": {"vf-sandbox.managed-network": "true"},
        }
        try:
            net = await docker.networks.create(config)
        except aiodocker.DockerError as exc2:
            if exc2.status != 409:  # 409: another process made it meanwhile
                raise ConfigError(f"network=True: cannot create the sandbox network {NETWORK}: {exc2.message}") from exc2
            net = await docker.networks.get(NETWORK)
        info = await net.show()
    if (info.get("Options") or {}).get("com.docker.network.bridge.name") != BRIDGE or info.get("Driver") != "bridge":
        raise ConfigError(f"a network named {NETWORK} exists but is not vf-sandbox's bridge {BRIDGE}; remove it "
                          f"(docker network rm {NETWORK}) and retry")
    subnets = [c.get("Subnet") for c in (info.get("IPAM") or {}).get("Config") or [] if c.get("Subnet")]
    if not subnets:
        raise ConfigError(f"the sandbox network {NETWORK} has no IPv4 subnet")
    for subnet in subnets:
        await asyncio.to_thread(apply_firewall, subnet)
    return NETWORK
