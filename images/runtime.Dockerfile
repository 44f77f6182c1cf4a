# The one runtime image of the edge emulator: the parameter server, the workers and the
# evaluator all run from it. Built by emulator/host/images.py (ensure_runtime_image), never by hand:
# the build runs with --network none; the wheels are downloaded on the host beforehand and
# arrive in the build context (wheels/), the project code in src/.
#
# BASE is python:3.11-slim, or edge-emulator/base:bookworm (Debian bookworm made with
# debootstrap and imported). Both have python3 3.11 with venv, groupadd and useradd.
ARG BASE=python:3.11-slim

# Stage 1: a venv with the pinned wheels, installed offline. Only /opt/venv leaves this stage,
# so the wheel files themselves never become a layer of the runtime image. TensorFlow's C++
# headers (tensorflow/include, ~290 MB) serve only to compile custom ops and are dropped.
FROM ${BASE} AS venv
LABEL edge-emulator="1" edge-emulator.role="builder"
COPY requirements.txt /build/requirements.txt
COPY wheels/ /build/wheels/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --no-index --find-links /build/wheels \
        --no-cache-dir --disable-pip-version-check -r /build/requirements.txt \
 && /opt/venv/bin/python -m pip check --disable-pip-version-check \
 && rm -rf /opt/venv/lib/python3*/site-packages/tensorflow/include

# Stage 2: the runtime image.
FROM ${BASE}
LABEL edge-emulator="1" edge-emulator.role="runtime"
RUN groupadd --gid 10001 device \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin device
COPY --from=venv /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/edge-emulator \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    LANG=C.UTF-8 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    EMULATE_NUMBA_PREBUILT=/opt/numba-cache
# The parameter server's compiled loops, compiled once here into numba's cache: a server copies it
# to its writable /tmp at start (compression/compiled.py) instead of compiling for ~12 s. Only the
# kernels' own file is copied first, so a change elsewhere in the code does not compile them again;
# the full copy below brings the same file with the same size and time, which is what numba's cache
# checks. A machine whose CPU differs from this one's compiles them again at the server's start.
COPY src/compression/_numba_kernels.py /opt/edge-emulator/compression/_numba_kernels.py
RUN NUMBA_CACHE_DIR=/opt/numba-cache python -c "import importlib.util as u; \
s = u.spec_from_file_location('compression._numba_kernels', '/opt/edge-emulator/compression/_numba_kernels.py'); \
m = u.module_from_spec(s); s.loader.exec_module(m); m.warm_up()" \
 && chmod -R a+rX /opt/numba-cache
USER 10001
WORKDIR /tmp
# The project code (emulator/ and compression/, *.py only) comes last: a code change rebuilds
# only this layer, in seconds.
COPY src/ /opt/edge-emulator/
