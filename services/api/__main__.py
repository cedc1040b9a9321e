"""`python -m trainforge_services.api`: serve the REST API with settings from TF_* environment variables."""

from __future__ import annotations

import logging
import sys

import uvicorn
from pydantic import ValidationError

from trainforge_services.api.app import create_app
from trainforge_services.common.observability import configure_logging
from trainforge_services.common.settings import ApiSettings


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = ApiSettings()
    except ValidationError as e:
        print(f"invalid settings: {e}", file=sys.stderr)
        return 2
    if settings.log_json:
        configure_logging(json_logs=True)
    try:
        app = create_app(settings)
    except ValueError as e:  # settings it cannot serve with, e.g. a JWT secret too short for its algorithm
        print(f"invalid settings: {e}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=settings.api_host, port=settings.api_port, log_level="info", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
