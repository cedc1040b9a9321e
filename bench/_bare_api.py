"""The baseline of bench/api_read.py: a bare FastAPI endpoint returning a fixed job JSON under uvicorn.

The same uvicorn settings as `python -m trainforge_services.api` (one worker, access log off), a sync route like
the real GET /v1/jobs/{id} (run in the thread pool), no authentication and no Trainer call.
Usage: python bench/_bare_api.py JSON_FILE PORT
"""

from __future__ import annotations

import json
import sys

import uvicorn
from fastapi import FastAPI

app = FastAPI()
BODY = json.loads(open(sys.argv[1]).read())  # noqa: SIM115 - read once at start


@app.get("/v1/jobs/{job_id}")
def get_job(job_id: str) -> dict:
    return BODY


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
