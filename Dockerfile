# prewarm: one image for every service (worker, beat, api, flower, simulator).
# CPU-only: torch is pinned to the CPU build before anything can pull a CUDA one.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PREWARM_DATA_DIR=/var/lib/prewarm \
    HF_HUB_OFFLINE=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY models ./models
COPY tasks ./tasks
COPY jobs ./jobs
RUN pip install ".[models,ops]"

RUN useradd --create-home --uid 10001 prewarm \
    && mkdir -p /var/lib/prewarm && chown prewarm /var/lib/prewarm
USER prewarm

# The api listens here; compose overrides the command per service.
EXPOSE 8080
CMD ["prewarm", "api", "--host", "0.0.0.0", "--port", "8080"]
