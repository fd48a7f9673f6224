"""The backend API over HTTP: what `mcprl serve --train` serves beside the OpenAI API, and what
`RemoteBackend` calls. Every route takes and returns JSON, behind the server's API key:

    POST /backend/check        {base_model}                    -> {}
    POST /backend/register     {model}                         -> {step, base_name}
    POST /backend/base         {base_model}                    -> {name}
    POST /backend/serve        {model, step}                   -> {name}
    POST /backend/step         {model}                         -> {step}
    POST /backend/train        {model, step, groups, config, metrics}
                                 -> {job, state, done, total, result?}   (202 while it runs)
    GET  /backend/jobs/{job}               -> {state, done, total, result?, error?}
    POST /backend/log          {model, metrics, split, groups?} -> {}
    POST /backend/history      {model}                         -> {rows}
    POST /backend/trajectories {model, split}                  -> {steps: {step: [group]}}
    POST /backend/files/read   {model, file}                   -> {text}
    POST /backend/files/write  {model, file, text}             -> {}
    POST /backend/checkpoints  {model}                         -> {steps}
    POST /backend/checkpoints/delete   {model, keep_last, keep_best_by} -> {deleted}
    POST /backend/checkpoints/download {model, step}           -> a tar of the checkpoint

`model` is a `TrainableModel` as JSON (name, project, base_model, config). A training request
names the step it trains from: a server already past it (the reply of a finished step was lost,
or the client retries after the server restarted) answers with that step's result instead of
training twice; a server at another step answers 409. Training runs as a job the client polls
for progress; a server restarted mid-step has forgotten the job (404), and the client sends the
step again: its checkpoints and records are all on disk.
"""

from __future__ import annotations

import asyncio
import io
import logging
import tarfile
import uuid
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mcprl.model import TrainableModel
from mcprl.training import TrainConfig
from mcprl.types import TrajectoryGroup


# the serving package loads torch: imported when a request comes, not with `import mcprl`
def fail(*args: Any, **kwargs: Any) -> Any:
    from mcprl.serving import fail as serving_fail

    return serving_fail(*args, **kwargs)


async def json_body(*args: Any, **kwargs: Any) -> Any:
    from mcprl.serving import json_body as serving_json_body

    return await serving_json_body(*args, **kwargs)


__all__ = ["MAX_UPLOAD_BYTES", "backend_routes"]

logger = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 512 * 1024 * 1024  # a step's groups with their token ids and log-probs


def _model(body: dict[str, Any]) -> TrainableModel:
    data = body.get("model")
    if not isinstance(data, dict):
        raise fail(400, "give 'model' as an object (name, project, base_model, config)", "model")
    try:
        return TrainableModel.model_validate(data)
    except ValidationError as exc:
        raise fail(400, f"model: {exc.errors()[0]['msg']}", "model") from exc


def _groups(items: Any) -> list[TrajectoryGroup]:
    if not isinstance(items, list):
        raise fail(400, "give 'groups' as a list of trajectory groups", "groups")
    try:
        return [TrajectoryGroup.model_validate(g) for g in items]
    except ValidationError as exc:
        raise fail(400, f"groups: {exc.errors()[0]['msg']}", "groups") from exc


def backend_routes(backend: Any) -> list[tuple[str, Any, list[str]]]:
    """The routes above, serving `backend` (a `LocalBackend`) for `build_app(routes=...)`."""
    jobs: dict[str, dict[str, Any]] = {}
    running: dict[tuple[str, str], str] = {}  # (project, name) -> its training job

    async def registered(body: dict[str, Any]) -> TrainableModel:
        model = _model(body)
        try:
            await backend.register(model)  # resumes the run after a server restart
        except ValueError as exc:
            raise fail(400, str(exc), "model") from exc
        return model

    def same_base(body: dict[str, Any]) -> None:
        wanted, served = body.get("base_model"), backend.base_model
        if served is not None and wanted != served:
            raise fail(
                400,
                f"this server trains {served!r}, not {wanted!r}: use `base_model={served}`, or "
                f"start another server for `base_model={wanted}`",
                "base_model",
            )

    async def check(request: Request) -> JSONResponse:
        same_base(await json_body(request))
        return JSONResponse({})

    async def register(request: Request) -> JSONResponse:
        model = await registered(await json_body(request))
        where = await backend.inference(model)
        return JSONResponse({"step": await backend.get_step(model), "base_name": where.base_name})

    async def base(request: Request) -> JSONResponse:
        same_base(await json_body(request))
        where = await backend.base_inference(backend.base_model)
        return JSONResponse({"name": where.base_name})

    async def serve(request: Request) -> JSONResponse:
        body = await json_body(request)
        model, step = await registered(body), body.get("step")
        if not isinstance(step, int):
            raise fail(400, "give 'step' as a whole number", "step")
        try:
            return JSONResponse({"name": await backend.serve_checkpoint(model, step)})
        except ValueError as exc:
            raise fail(404, str(exc), "step") from exc

    async def step(request: Request) -> JSONResponse:
        model = await registered(await json_body(request))
        return JSONResponse({"step": await backend.get_step(model)})

    async def finished(model: TrainableModel, step: int) -> dict[str, Any]:
        rows = await backend.history(model)
        row = next((r for r in reversed(rows) if r.get("step") == step), {})
        metrics = {k.removeprefix("train/"): v for k, v in row.items() if k.startswith("train/")}
        return {"step": step, "metrics": metrics}

    async def train(request: Request) -> JSONResponse:
        body = await json_body(request, MAX_UPLOAD_BYTES)
        model = await registered(body)
        key = (model.project, model.name)
        if key in running:
            return JSONResponse({"job": running[key], **jobs[running[key]]}, status_code=202)
        expected, current = body.get("step"), await backend.get_step(model)
        if not isinstance(expected, int):
            raise fail(400, "give 'step', the step the groups were rolled out at", "step")
        if current == expected + 1:  # trained already: the reply was lost, or a retry
            return JSONResponse(
                {"job": None, "state": "done", "result": await finished(model, current)}
            )
        if current != expected:
            raise fail(
                409,
                f"{model.project}/{model.name} is at step {current} here, and the groups were "
                f"rolled out at step {expected}; register the model again to continue",
                "step",
            )
        groups = _groups(body.get("groups"))
        try:
            config = TrainConfig.model_validate(body.get("config") or {})
        except ValidationError as exc:
            raise fail(400, f"config: {exc.errors()[0]['msg']}", "config") from exc
        job_id = uuid.uuid4().hex
        job: dict[str, Any] = {"state": "running", "done": 0, "total": 0}

        def progress(done: int, total: int) -> None:
            job["done"], job["total"] = done, total

        async def work() -> None:
            try:
                result = await backend.train(
                    model, groups, config, metrics=body.get("metrics"), on_progress=progress
                )
                job.update(state="done", result=result.model_dump())
            except Exception as exc:
                logger.exception("training %s/%s failed", *key)
                job.update(state="failed", error=f"{type(exc).__name__}: {exc}")
            finally:
                running.pop(key, None)

        jobs[job_id] = job
        running[key] = job_id
        job["_task"] = asyncio.get_running_loop().create_task(work())
        return JSONResponse({"job": job_id, **_public(job)}, status_code=202)

    async def job(request: Request) -> JSONResponse:
        found = jobs.get(request.path_params["job"])
        if found is None:
            raise fail(404, "no such training job here (the server may have restarted)", "job")
        return JSONResponse(_public(found))

    async def log(request: Request) -> JSONResponse:
        body = await json_body(request, MAX_UPLOAD_BYTES)
        model = await registered(body)
        groups = _groups(body["groups"]) if body.get("groups") is not None else None
        metrics = body.get("metrics")
        if not isinstance(metrics, dict):
            raise fail(400, "give 'metrics' as an object of numbers", "metrics")
        try:
            await backend.log(model, metrics, str(body.get("split", "val")), groups)
        except ValueError as exc:
            raise fail(400, str(exc), "split") from exc
        return JSONResponse({})

    async def history(request: Request) -> JSONResponse:
        return JSONResponse({"rows": await backend.history(_model(await json_body(request)))})

    async def trajectories(request: Request) -> Response:
        body = await json_body(request)
        try:
            steps = await backend.trajectories(_model(body), str(body.get("split", "train")))
        except ValueError as exc:
            raise fail(400, str(exc), "split") from exc
        payload = {str(k): [g.model_dump(mode="json") for g in v] for k, v in steps.items()}
        return JSONResponse({"steps": payload})

    async def read_file(request: Request) -> JSONResponse:
        body = await json_body(request)
        try:
            text = await backend.read_file(_model(body), str(body.get("file")))
        except ValueError as exc:
            raise fail(400, str(exc), "file") from exc
        return JSONResponse({"text": text})

    async def write_file(request: Request) -> JSONResponse:
        body = await json_body(request, MAX_UPLOAD_BYTES)
        if not isinstance(body.get("text"), str):
            raise fail(400, "give 'text' as a string", "text")
        try:
            await backend.write_file(_model(body), str(body.get("file")), body["text"])
        except ValueError as exc:
            raise fail(400, str(exc), "file") from exc
        return JSONResponse({})

    async def checkpoints(request: Request) -> JSONResponse:
        model = _model(await json_body(request))
        return JSONResponse({"steps": await backend.list_checkpoints(model)})

    async def delete(request: Request) -> JSONResponse:
        body = await json_body(request)
        model = await registered(body)
        deleted = await backend.delete_checkpoints(
            model, int(body.get("keep_last", 1)), body.get("keep_best_by", "val/reward")
        )
        return JSONResponse({"deleted": deleted})

    async def download(request: Request) -> Response:
        body = await json_body(request)
        model, step = await registered(body), body.get("step")
        if not isinstance(step, int):
            raise fail(400, "give 'step' as a whole number", "step")
        try:
            path = backend.checkpoint(model, step)
        except ValueError as exc:
            raise fail(404, str(exc), "step") from exc
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(path, arcname=".")
        return Response(buffer.getvalue(), media_type="application/x-tar")

    return [
        ("/backend/check", check, ["POST"]),
        ("/backend/register", register, ["POST"]),
        ("/backend/base", base, ["POST"]),
        ("/backend/serve", serve, ["POST"]),
        ("/backend/step", step, ["POST"]),
        ("/backend/train", train, ["POST"]),
        ("/backend/jobs/{job}", job, ["GET"]),
        ("/backend/log", log, ["POST"]),
        ("/backend/history", history, ["POST"]),
        ("/backend/trajectories", trajectories, ["POST"]),
        ("/backend/files/read", read_file, ["POST"]),
        ("/backend/files/write", write_file, ["POST"]),
        ("/backend/checkpoints", checkpoints, ["POST"]),
        ("/backend/checkpoints/delete", delete, ["POST"]),
        ("/backend/checkpoints/download", download, ["POST"]),
    ]


def _public(job: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in job.items() if not k.startswith("_")}
