"""Bad input battery: every case is a 4xx naming the field and the rule, and writes nothing."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from api.http.json_depth import MAX_JSON_DEPTH
from tests.helpers import tiny_spec
from tests.user_models import GPT2_SPEC, LLAMA_SPEC


def _user_model(model: dict, **overrides) -> dict:
    return tiny_spec(**{"model": model, "data.seq_len": 16, **overrides})


def _fails(resp: httpx.Response, status: int, *needles: str) -> dict:
    assert resp.status_code == status, f"{resp.status_code} != {status}: {resp.text}"
    body = resp.json()
    text = json.dumps(body)
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text}"
    assert body["detail"]
    return body


CASES = [
    ("malformed JSON", dict(content=b'{"name": "x",', headers={"content-type": "application/json"}),
     422, ["body", "malformed JSON"]),
    ("not an object", dict(json=[1, 2]), 422, ["a job spec must be a JSON object"]),
    ("wrong type", dict(json=tiny_spec(**{"train.steps": "many"})), 422, ["train.steps", "integer"]),
    ("negative", dict(json=tiny_spec(**{"train.lr": -1})), 422, ["train.lr", "greater than 0"]),
    ("unknown field", dict(json={**tiny_spec(), "bogus": 1}), 422, ["bogus", "is not a top-level key of the spec"]),
    ("unknown nested field", dict(json=tiny_spec(**{"train.stepz": 3})), 422,
     ["train.stepz", "did you mean train.steps?"]),
    ("a field error and a cross-field error", dict(json=tiny_spec(**{"train.lr": -1, "parallel.dp": 3,
                                                                    "resources.workers": 2})), 422,
     ["train.lr: must be greater than 0 (got -1)", "dp x tp x pp must equal resources.workers"]),
    ("missing name", dict(json={k: v for k, v in tiny_spec().items() if k != "name"}), 422, ["name", "name: is required"]),
    ("impossible layout", dict(json=tiny_spec(**{"parallel.dp": 3, "resources.workers": 2})), 422,
     ["parallel", "dp x tp x pp must equal resources.workers"]),
    ("checkpoint off the checked steps", dict(json=tiny_spec(**{
        "resources.workers": 2, "fault_tolerance.integrity_check_every": 4, "checkpoint.every_steps": 6})), 422,
     ["checkpoint.every_steps", "multiple of fault_tolerance.integrity_check_every"]),
    ("rebalance with fsdp", dict(json=tiny_spec(**{
        "parallel.zero": 3, "resources.workers": 2, "supervisor.straggler.policy": "rebalance"})), 422,
     ["supervisor.straggler.policy", "parallel.zero 3"]),
    ("batch not divisible", dict(json=tiny_spec(**{"train.global_batch_size": 10})), 422,
     ["train.global_batch_size", "divisible"]),
    ("never fits the cluster", dict(json=tiny_spec(**{"resources.workers": 4, "resources.cpus_per_worker": 4})), 422,
     ["resources", "whole cluster has 8"]),
    ("worker bigger than any node", dict(json=tiny_spec(**{"resources.cpus_per_worker": 64})), 422,
     ["resources", "needs 64 CPU"]),
    # The planner's predicted peak per worker against the nodes' memory (issue 46: terabytes of state).
    ("a model no node can hold", dict(json=tiny_spec(
        model={"name": "gpt", "n_layers": 256, "d_model": 16384, "n_heads": 128, "seq_len": 64},
        **{"parallel.dp": 4, "parallel.zero": 3, "resources.workers": 4})), 422,
     ["resources", "824.70 B parameters", "GiB per worker", "more than the largest node's memory"]),
    ("over memory_per_worker_gib", dict(json=tiny_spec(**{"resources.memory_per_worker_gib": 0.001})), 422,
     ["resources.memory_per_worker_gib", "predicted peak", "more than resources.memory_per_worker_gib (0.001 GiB)"]),
    ("hf model over memory_per_worker_gib", dict(json=_user_model(LLAMA_SPEC["model"], **{
        "resources.memory_per_worker_gib": 0.001})), 422,
     ["resources.memory_per_worker_gib", "the model (hf llama, 2 layers", "predicted peak", "(0.001 GiB)"]),
    ("gpus on a cpu cluster", dict(json=tiny_spec(**{"resources.gpus_per_worker": 1})), 422, ["GPU", "whole cluster has 0"]),
    ("two gpus per rank of the built-in loop", dict(json=tiny_spec(**{"resources.gpus_per_worker": 2})), 422,
     ["resources.gpus_per_worker", "one rank per GPU", "machines x 2"]),
    ("priority out of range", dict(json=tiny_spec(), params={"priority": 10**6}), 422, ["priority"]),
    ("priority not a number", dict(json=tiny_spec(), params={"priority": "high"}), 422, ["priority"]),
    ("idempotency key too long", dict(json=tiny_spec(), headers={"Idempotency-Key": "k" * 500}), 422, ["idempotency-key"]),
    ("huge body", dict(json={**tiny_spec(), "pad": "x" * 300_000}), 413, ["body", "over the limit"]),
    # Tracking: the server must be an http(s) URL, keys are the contract, MLflow's own tags are its own.
    ("tracking uri not http", dict(json=tiny_spec(**{"tracking.mlflow": {"tracking_uri": "file:///tmp/mlruns"}})),
     422, ["tracking.mlflow.tracking_uri", "http:// or https:// URL"]),
    ("tracking unknown key", dict(json=tiny_spec(**{"tracking.mlflow": {"tracking_uri": "http://m:5000",
                                                                       "experment": "x"}})),
     422, ["tracking.mlflow.experment", "did you mean tracking.mlflow.experiment?"]),
    ("tracking reserved tag", dict(json=tiny_spec(**{"tracking.mlflow": {"tracking_uri": "http://m:5000",
                                                                        "tags": {"mlflow.user": "x"}}})),
     422, ["tracking.mlflow.tags", "MLflow's own"]),
    ("tensorboard not a flag", dict(json=tiny_spec(**{"tracking.tensorboard": "sometimes"})), 422,
     ["tracking.tensorboard", "boolean"]),
    # Users' own models: each incompatible combination names the field and says what to do.
    ("hf unknown model type", dict(json=_user_model({"hf": {"model_type": "lama"}})), 422,
     ["model.hf.model_type", "did you mean 'llama'"]),
    ("hf unknown config field", dict(json=_user_model({"hf": {"model_type": "llama", "config": {"hidden_sise": 8}}})),
     422, ["model.hf.config.hidden_sise", "LlamaConfig"]),
    ("user model without data.seq_len", dict(json={**LLAMA_SPEC, "data": {"name": "text:pystdlib"}}), 422,
     ["data.seq_len", "required"]),
    ("tp over a user module without a plan", dict(json=_user_model(
        {"entrypoint": "tests.fixtures.block_models:token_mlp"}, **{"parallel.tp": 2, "resources.workers": 2})),
     422, ["model.tp_plan", "give"]),
    ("tp over GPT-2 (no plan shipped)", dict(json={**GPT2_SPEC, "parallel": {"tp": 2}, "resources": {"workers": 2}}),
     422, ["model.tp_plan", "ships no tensor-parallel plan"]),
    ("tp not dividing the kv heads", dict(json={**LLAMA_SPEC, "parallel": {"tp": 4}, "resources": {"workers": 4}}),
     422, ["parallel.tp", "key/value heads"]),
    ("pp with tied embeddings", dict(json=_user_model({"hf": {"model_type": "gpt2", "config": {"n_layer": 2}}},
                                                      **{"parallel.pp": 2, "resources.workers": 2})),
     422, ["model.hf.config.tie_word_embeddings", "must be false"]),
    ("hf.pretrained outside the storage root", dict(json=_user_model({"hf": {"pretrained": "../../etc"}})), 422,
     ["model.hf.pretrained", "'..'"]),
    # Data files: what can be known before the job runs.
    ("data files matching nothing", dict(json=tiny_spec(data={"files": {"paths": ["/nonexistent/train-*.bin"],
                                                                        "seq_len": 16}})),
     422, ["data.files.paths", "matches no file"]),
    ("data files of an unknown format", dict(json=tiny_spec(data={"files": {"paths": ["s3://b/x-*.bin"], "seq_len": 16,
                                                                            "format": "csv"}})),
     422, ["data.files.format", "'tokens', 'jsonl', 'parquet' or 'text'"]),
    ("data files of an unknown dtype", dict(json=tiny_spec(data={"files": {"paths": ["s3://b/x-*.bin"], "seq_len": 16,
                                                                           "dtype": "float32"}})),
     422, ["data.files.dtype"]),
    ("model loss with pair data", dict(json={**LLAMA_SPEC, "train": {"loss": "model"}}), 422,
     ["train.loss", "labels"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_invalid_submissions_are_4xx_and_write_nothing(tenant, counts, case):
    _, kwargs, status, needles = case
    before = counts()
    _fails(tenant.post("/v1/jobs", **kwargs), status, *needles)
    assert counts() == before


def test_a_shard_shorter_than_seq_len_is_422_naming_it(tenant, counts, tmp_path):
    (tmp_path / "train-000.bin").write_bytes(b"\0" * 40)  # 20 uint16 tokens
    before = counts()
    spec = tiny_spec(data={"files": {"paths": [str(tmp_path / "train-*.bin")], "seq_len": 32}})
    _fails(tenant.post("/v1/jobs", json=spec), 422, "data.files.paths", "train-000.bin holds 20 tokens, fewer than")
    assert counts() == before


def test_huge_chunked_body_is_413(tenant, counts):
    before = counts()

    def chunks():
        yield b'{"name": "x", "pad": "'
        for _ in range(50):
            yield b"x" * 10_000
        yield b'"}'

    _fails(tenant.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"}), 413, "over the limit")
    assert counts() == before


def _nested(depth: int) -> bytes:
    """A spec whose `bogus` key nests lists so that the whole body is `depth` levels deep (json.dumps
    itself recurses out long before 5,000)."""
    inner = depth - 1  # the spec object is the first level
    return json.dumps({**tiny_spec(), "bogus": "X"}).encode().replace(b'"X"', b"[" * inner + b"]" * inner)


def _connection(resp: httpx.Response) -> tuple:
    return resp.extensions["network_stream"].get_extra_info("client_addr")  # the client's end of the socket


def test_deeply_nested_body_is_422_writes_nothing_and_keeps_the_connection(tenant, counts):
    before = counts()
    resp = tenant.post("/v1/jobs", content=_nested(5000), headers={"content-type": "application/json"})
    _fails(resp, 422, "body", f"nested 5000 levels deep, deeper than {MAX_JSON_DEPTH} levels (the limit)")
    assert counts() == before
    after = tenant.get("/v1/jobs")
    assert after.status_code == 200, after.text
    assert _connection(after) == _connection(resp)  # the same keep-alive connection served it


@pytest.mark.parametrize("path", ["/v1/plans", "/v1/tenants", "/v1/tokens"])
def test_every_json_route_bounds_the_nesting(queue_server, counts, path):
    """The spec routes and the routes whose body FastAPI decodes (before any token check, like the size limit)."""
    before = counts()
    with queue_server.client() as admin:
        _fails(admin.post(path, content=_nested(MAX_JSON_DEPTH + 1)), 422, f"deeper than {MAX_JSON_DEPTH} levels")
    assert counts() == before


def test_nesting_at_the_limit_or_inside_a_string_is_no_depth_error(tenant, counts):
    before = counts()
    at_limit = tenant.post("/v1/jobs", content=_nested(MAX_JSON_DEPTH), headers={"content-type": "application/json"})
    body = _fails(at_limit, 422, "bogus", "is not a top-level key")  # the spec's own rules, as usual
    assert "levels deep" not in json.dumps(body)
    in_string = tenant.post("/v1/jobs", json=tiny_spec(name='\\"' + "[" * 5000))  # an escaped quote, then brackets
    body = _fails(in_string, 422, "name", "pattern")
    assert "levels deep" not in json.dumps(body)
    assert counts() == before


@pytest.mark.parametrize("headers,needle", [
    ({}, "missing bearer token"),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, "must be 'Bearer <token>'"),
    ({"Authorization": "Bearer"}, "must be 'Bearer <token>'"),
    ({"Authorization": "Bearer ty_forged_0000"}, "unknown or revoked token"),
])
def test_missing_or_forged_tokens_are_401(queue_server, counts, headers, needle):
    before = counts()
    with httpx.Client(base_url=queue_server.url, headers=headers) as anon:
        for method, path in [("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/abc"),
                             ("POST", "/v1/jobs/abc/cancel"), ("GET", "/v1/jobs/abc/logs")]:
            resp = anon.request(method, path, json=tiny_spec() if method == "POST" else None)
            body = _fails(resp, 401, needle)
            assert resp.headers["www-authenticate"] == "Bearer", body
    assert counts() == before


def test_another_tenants_job_is_404_everywhere(queue_server, tenant, counts):
    job = tenant.post("/v1/jobs", json=tiny_spec()).json()
    with queue_server.client() as admin:
        other = admin.post("/v1/tenants", json={"name": "intruder-" + job["id"][:6]}).json()["token"]
    before = counts()
    with queue_server.client(other) as intruder:
        for method, suffix in [("GET", ""), ("POST", "/cancel"), ("GET", "/events"), ("GET", "/metrics"),
                               ("GET", "/logs"), ("GET", "/checkpoints"), ("GET", "/checkpoints/model")]:
            _fails(intruder.request(method, f"/v1/jobs/{job['id']}{suffix}"), 404, "not found")
        assert intruder.get("/v1/jobs").json()["jobs"] == []
    assert counts() == before
    assert tenant.get(f"/v1/jobs/{job['id']}").json()["state"] == "QUEUED"


def test_unknown_ids_bad_queries_and_missing_scope(tenant, counts):
    job = tenant.post("/v1/jobs", json=tiny_spec()).json()
    before = counts()
    _fails(tenant.get("/v1/jobs/does-not-exist"), 404, "not found")
    _fails(tenant.get("/v1/jobs", params={"state": "SLEEPING"}), 422, "state")
    _fails(tenant.get("/v1/jobs", params={"limit": 0}), 422, "limit")
    _fails(tenant.get(f"/v1/jobs/{job['id']}/logs", params={"rank": 7}), 422, "rank", "[0, 0]")
    _fails(tenant.get(f"/v1/jobs/{job['id']}/logs", params={"tail": -1}), 422, "tail")
    _fails(tenant.get(f"/v1/jobs/{job['id']}/checkpoints/model"), 404, "no exported model")
    _fails(tenant.post("/v1/tenants", json={"name": "sneaky"}), 403, "admin")
    assert counts() == before


def test_illegal_transition_is_409(tenant):
    job = tenant.post("/v1/jobs", json=tiny_spec()).json()
    assert tenant.post(f"/v1/jobs/{job['id']}/cancel").json()["state"] == "CANCELLED"
    _fails(tenant.post(f"/v1/jobs/{job['id']}/cancel"), 409, "CANCELLED to CANCELLED")


def test_bad_tenant_requests(queue_server, counts):
    before = counts()
    with queue_server.client() as admin:
        _fails(admin.post("/v1/tenants", json={"name": "Bad Name!"}), 422, "name")
        _fails(admin.post("/v1/tenants", json={"name": "ok", "extra": 1}), 422, "extra")
        _fails(admin.post("/v1/tenants", content=b"{", headers={"content-type": "application/json"}), 422)
    assert counts() == before


def test_an_accepted_job_says_what_its_memory_check_compared_or_that_it_could_not(queue_server):
    with queue_server.client() as admin:
        resp = admin.post("/v1/tenants", json={"name": f"m-{uuid.uuid4().hex[:8]}", "allow_user_code": True})
        assert resp.status_code == 201, resp.text
    with queue_server.client(resp.json()["token"]) as tenant:
        _says_what_its_memory_check_compared(tenant)


def _says_what_its_memory_check_compared(tenant) -> None:
    # The built-in GPT (arithmetic) and a Hugging Face config (built on the meta device) are predicted and
    # compared with the tightest budget; an entrypoint model is user code the service does not run: said so.
    gpt = tenant.post("/v1/jobs", json=tiny_spec(**{"resources.memory_per_worker_gib": 4}))
    assert gpt.status_code == 201, gpt.text
    memory = gpt.json()["memory"]
    assert memory["predicted"] and 0 < memory["peak_per_worker_gib"] < memory["budget_gib"] <= 4, memory
    hf = tenant.post("/v1/jobs", json=_user_model(LLAMA_SPEC["model"], **{"resources.memory_per_worker_gib": 4}))
    assert hf.status_code == 201, hf.text
    assert hf.json()["memory"]["predicted"] and hf.json()["memory"]["peak_per_worker_gib"] > 0, hf.json()["memory"]
    entry = tenant.post("/v1/jobs", json=_user_model({"entrypoint": "tests.fixtures.block_models:token_mlp",
                                                      "args": {"width": 32, "depth": 2}}))
    assert entry.status_code == 201, entry.text
    assert entry.json()["memory"] == {"predicted": False, "reason": "model.entrypoint is user code, not run at submit: "
                                      "not predicted; a rank out of memory fails the job at once"}
