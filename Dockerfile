# vaultmail in a container: `vaultmail serve` by default (configure it with the variables of
# the README, or a .env file mounted at /data/.env); compose.yaml runs `vaultmail up` instead.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/vaultmail
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY handlers ./handlers
COPY labels ./labels
COPY localforge ./localforge
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --user-group --home-dir /data --create-home vaultmail

USER vaultmail
WORKDIR /data
VOLUME ["/data"]
ENV VAULTMAIL_DATA=/data HOST=0.0.0.0 PORT=8080
EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8080'), timeout=4)"]

# exec form: SIGTERM reaches vaultmail itself, which drains within 10 s
ENTRYPOINT ["vaultmail"]
CMD ["serve"]
