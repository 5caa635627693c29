#!/usr/bin/env bash
# Idempotent set-up of everything vf-sandbox needs on a fresh Debian machine:
# the Python venv with the project, a running Docker engine, the offline base
# image and the default sandbox images, bubblewrap and Chromium for tests.
# Each step skips itself when its result is already there.
#   scripts/setup.sh            # full set-up
#   VF_SETUP_SKIP_BROWSER=1 ... # skip Chromium (not needed outside tests)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*"; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

apt_install() {  # apt_install PKG... (only the missing ones)
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  if [ ! -f /tmp/.vf-apt-updated ]; then $SUDO apt-get update -qq && touch /tmp/.vf-apt-updated; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

# 1. Python environment ------------------------------------------------------
# uv trusts the system's CA store (as pip does here), also where an intercepting
# proxy's CA is installed there rather than in uv's bundled roots
export UV_NATIVE_TLS=${UV_NATIVE_TLS:-1}
if ! command -v uv >/dev/null 2>&1; then
  # a Debian python3 refuses system-wide pip installs (PEP 668): then uv goes to the user's ~/.local
  log "installing uv"
  python3 -m pip install -q uv 2>/dev/null || python3 -m pip install -q --user --break-system-packages uv
  export PATH="$HOME/.local/bin:$PATH"
  command -v uv >/dev/null 2>&1 || { echo "setup: could not install uv" >&2; exit 1; }
fi
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"; uv venv -q .venv -p python3.11 2>/dev/null || uv venv -q .venv
fi
STAMP=.venv/.vf-installed
HASH=$(cat pyproject.toml environments/*/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)
if [ "$(cat $STAMP 2>/dev/null)" != "$HASH" ]; then
  log "installing vf-sandbox and its dependencies into .venv"
  uv pip install -q --python .venv/bin/python -e '.[dev,prime,openenv,mcp,ray,swe,renderers,frameworks]'
  for envdir in environments/*/; do
    [ -f "$envdir/pyproject.toml" ] && uv pip install -q --python .venv/bin/python -e "$envdir"
  done
  echo "$HASH" > $STAMP
fi
# Bytecode: uv installs without .pyc files and PYTHONDONTWRITEBYTECODE (set in some
# shells here) stops Python from writing them, so every process (CLI, Ray workers
# and job drivers, -w workers) compiled its imports from source: `import ray` 0.7 s
# instead of 0.26 s. Compiled once here; compileall skips what is up to date.
.venv/bin/python -m compileall -q -j 0 .venv/lib/python3*/site-packages envs runs runner hosted dashboard vfcli testmodel sandboxes backends swe_debug \
  environments >/dev/null 2>&1 || true

# 1b. Harbor (Python >= 3.12) in its own venv, .venv-harbor, with vf-sandbox (editable):
# integrations/harbor_env.py is Harbor's environment provider; tests/test_harbor_provider.py
# and benchmarks/bench_harbor.py run the `harbor` CLI from there. Skipped with a warning
# when no Python 3.12+ is found (those tests then fail loudly).
HARBOR_VERSION=0.26.0
HARBOR_PY=$(uv python find '>=3.12' 2>/dev/null || ls -d /root/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null | head -1 || true)
HSTAMP=.venv-harbor/.vf-installed
HHASH="$HARBOR_VERSION $(cat pyproject.toml | sha256sum | cut -c1-16)"
if [ -z "$HARBOR_PY" ]; then
  echo "warning: no Python >= 3.12: .venv-harbor (Harbor) not set up" >&2
elif [ "$(cat $HSTAMP 2>/dev/null)" != "$HHASH" ]; then
  log "installing harbor $HARBOR_VERSION and vf-sandbox into .venv-harbor ($HARBOR_PY)"
  [ -x .venv-harbor/bin/python ] || uv venv -q .venv-harbor -p "$HARBOR_PY"
  uv pip install -q --python .venv-harbor/bin/python "harbor==$HARBOR_VERSION" -e .
  echo "$HHASH" > $HSTAMP
fi

# 2. Docker engine -----------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null 2>&1 || apt_install docker.io
  # a daemon already starting writes its pid here; any other dockerd (another data-root) is not ours
  if ! { [ -f /var/run/docker.pid ] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; }; then
    log "starting dockerd (no bridge network: sandboxes run with networking off)"
    setsid nohup dockerd --bridge=none --iptables=false --ip-masq=false >/tmp/vf-dockerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "Docker engine did not start; see /tmp/vf-dockerd.log" >&2; exit 1; }
fi
log "docker engine answers ($(docker version -f '{{.Server.Version}}'))"

# 2b. gVisor (isolation = "gvisor"): Debian's runsc as the engine runtime "runsc",
# ptrace platform (KVM hangs on these machines). Registered only with an engine
# this script manages (the dockerd whose pid is in /var/run/docker.pid, started
# with --bridge=none): daemon.json's "runtimes" is merged, then the daemon is
# reloaded with SIGHUP (a reload: running containers survive). Any other engine
# is only checked; sandboxes asking for gVisor there get an error saying how.
runsc_registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }
if ! runsc_registered; then
  command -v runsc >/dev/null 2>&1 || apt_install runsc
  pidfile=/var/run/docker.pid
  if [ -f $pidfile ] && ps -o args= -p "$(cat $pidfile)" 2>/dev/null | grep -q -- '--bridge=none'; then
    log "registering gVisor (runsc, ptrace platform) with the engine"
    $SUDO mkdir -p /etc/docker
    $SUDO python3 - "$(command -v runsc)" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
conf = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
conf.setdefault("runtimes", {})["runsc"] = {"path": sys.argv[1], "runtimeArgs": ["--platform=ptrace", "--network=none"]}
tmp = path + ".vf-tmp"
with open(tmp, "w") as f:
    json.dump(conf, f, indent=2)
os.replace(tmp, path)
PY
    $SUDO kill -HUP "$(cat $pidfile)"
    for _ in $(seq 1 20); do runsc_registered && break; sleep 0.5; done
    runsc_registered || echo "warning: the engine did not pick up the runsc runtime (see /etc/docker/daemon.json)" >&2
  else
    log "the Docker engine is not managed here: gVisor sandboxes need its runtime 'runsc' (see backends/README.md)"
  fi
fi

# 2c. `docker compose` v2 for Harbor's own Docker environment (benchmarks/bench_harbor.py
# compares our provider with it): bookworm packages only compose v1 (1.29.2), whose CLI
# Harbor does not call; Debian trixie's docker-compose 2.x is a static Go binary (a CLI
# plugin, depends on libc6 >= 2.34 only), fetched with apt from a private list of trixie,
# the system's sources untouched.
if ! docker compose version >/dev/null 2>&1; then
  TRIXIE=/var/cache/vf-apt-trixie
  APT_TRIXIE=(-o Dir::Etc::sourcelist=$TRIXIE/sources.list -o Dir::Etc::sourceparts=- -o Dir::State::Lists=$TRIXIE/lists)
  log "installing docker compose v2 (Debian trixie's docker-compose)"
  if ! { $SUDO mkdir -p $TRIXIE/lists/partial &&
         echo "deb http://deb.debian.org/debian trixie main" | $SUDO tee $TRIXIE/sources.list >/dev/null &&
         $SUDO apt-get update -qq "${APT_TRIXIE[@]}" &&
         (cd $TRIXIE && $SUDO apt-get download -qq "${APT_TRIXIE[@]}" docker-compose 2>/dev/null) &&
         $SUDO dpkg -i $TRIXIE/docker-compose_*.deb >/dev/null && docker compose version >/dev/null 2>&1; }; then
    echo "warning: docker compose v2 did not install (Harbor's own docker environment cannot run)" >&2
  fi
fi

# 3. Tools the backends and tests use ------------------------------------------
apt_install debootstrap bubblewrap patch git docker-registry apache2-utils  # registry: the real registry:2 server of the registry tests
if [ "${VF_SETUP_SKIP_BROWSER:-0}" != 1 ] && [ -x scripts/install-browser.sh ]; then
  scripts/install-browser.sh
fi

# 4. Images (offline: debootstrap base, then local builds; cached) ------------
images/base/build.sh
.venv/bin/vf-sandbox images build
for project in environments/openenv_echo/openenv_echo/echo_env environments/openenv_mcp/openenv_mcp/arith_mcp; do
  .venv/bin/vf-sandbox openenv build "$project" >/dev/null
done
log "ready"
