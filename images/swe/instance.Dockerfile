# Instance layer of a SWE instance image: the repository at its base commit in
# /testbed, committed with a fixed identity and date (so the commit hash is
# reproducible and checked against base_commit), then the install commands.
# Context: repo/, setup-repo.sh
ARG ENV_IMAGE
FROM ${ENV_IMAGE}
COPY repo /testbed
COPY setup-repo.sh /tmp/setup-repo.sh
WORKDIR /testbed
RUN bash -euo pipefail /tmp/setup-repo.sh && rm /tmp/setup-repo.sh
LABEL vf-sandbox.recipe=swe-instance
