# Environment layer of a SWE instance image: a venv at /opt/venv filled from a
# wheelhouse downloaded on the host (`pip download`), built with --network none.
# Context: wheels/, requirements.txt, requirements-nodeps.txt, env-setup.sh
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY wheels /tmp/wheels
COPY requirements.txt requirements-nodeps.txt env-setup.sh /tmp/
RUN python3 -m venv /opt/venv \
 && if [ -s /tmp/requirements.txt ]; then /opt/venv/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/requirements.txt; fi \
 && if [ -s /tmp/requirements-nodeps.txt ]; then /opt/venv/bin/pip install -q --no-index --no-deps --find-links /tmp/wheels -r /tmp/requirements-nodeps.txt; fi \
 && bash -euo pipefail /tmp/env-setup.sh \
 && rm -rf /tmp/wheels /root/.cache/pip
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/venv PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
LABEL vf-sandbox.recipe=swe-env
