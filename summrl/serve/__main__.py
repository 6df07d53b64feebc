"""``python -m summrl.serve run_dir=runs/<name> [step=best|latest|<N>] [serve.*=...]``: serve a trained run.

A bad value or run folder ends with one line and exit code 2 before any model loads; a missing bearer key
(``serve.api_key_env``) too. The server answers ``GET /health`` with 503 while the model loads, then 200.
"""

from __future__ import annotations

import asyncio
import os

import hydra
import uvicorn
from dotenv import load_dotenv
from omegaconf import DictConfig

from summrl import cli
from summrl.errors import ConfigError, exit_on
from summrl.serve.config import validate_serve


async def serve(config) -> None:
    from summrl.serve.app import Service, build_app  # heavy (openai, the backend): once the config is good

    service = Service(config)
    app = build_app(service)
    s = config.serve
    server = uvicorn.Server(uvicorn.Config(app, host=s.host, port=s.port, log_level="warning"))
    loading = asyncio.create_task(service.start())  # /health says 503 until it is done
    watching = asyncio.create_task(service.watch())  # serve.reload=auto
    try:
        await server.serve()
    finally:
        loading.cancel()
        watching.cancel()
        await service.close()


@hydra.main(config_path="../../conf", config_name="serve", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        config = validate_serve(cfg)
        load_dotenv()
        key_env = config.serve.api_key_env
        if key_env and not os.environ.get(key_env):
            raise ConfigError(f"serve.api_key_env={key_env}: the variable is not set; export {key_env}=<the key clients "
                              "must send>, or leave serve.api_key_env unset to serve without a key")
        os.environ.setdefault("TQDM_DISABLE", "1")
        asyncio.run(serve(config))
    except Exception as e:
        exit_on(e)


if __name__ == "__main__":
    cli.run(main)
