# kernel-audit: one image for the API, the workers and the migration step.
# GPU workers run it with the NVIDIA container runtime (torch's wheels carry the CUDA libraries).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /srv/kaudit

# bubblewrap isolates each submission (worker.sandbox.isolation); setpriv (util-linux) is already in the base image
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap=0.8.0-2+deb12u1 \
    && rm -rf /var/lib/apt/lists/*

# dependencies first, so code changes do not reinstall torch
COPY pyproject.toml README.md* ./
RUN mkdir -p app worker kernels \
    && touch app/__init__.py worker/__init__.py kernels/__init__.py \
    && pip install --no-cache-dir -e . \
    && useradd --create-home --uid 10001 kaudit

COPY alembic.ini ./
COPY migrations ./migrations
COPY kernels ./kernels
COPY worker ./worker
COPY app ./app

USER 10001
# the corpus tokenised at every size this catalogue's probes and canary draw (worker.text.warm): built once here,
# so that no audit trains a tokenizer on its own clock (1-2 s per size)
RUN kaudit warm-cache
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"]
CMD ["uvicorn", "--factory", "app.main:create_app", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
