"""Admission inside real FastDeploy: the engine's own insertion path (``EngineService.
_insert_zmq_task_to_scheduler`` with the checker it builds) refuses grammar syntax errors with
``error_code=400`` naming the position, and reads schemas without ``$schema`` as users mean them."""
import json

import pytest

import fastdeploy_engine as fe

pytestmark = pytest.mark.fastdeploy

SYNTAX = [
    ({"guided_grammar": 'root ::= ("a" | '}, "line 1, column"),
    ({"guided_grammar": 'start: "a" |'}, "line 1, column 12"),
    ({"structural_tag": json.dumps({"format": {"type": "tag", "begin": "<a>", "end": "</a>",
                                               "content": {"type": "grammar", "grammar": "root ::= x"}}})},
     "rule 'x' is not defined"),
    ({"guided_json": {"items": [{}], "prefixItems": [{}]}}, "prefixItems"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return fe.enabled_host(tmp_path_factory)


def _admit(cfg, data):
    from test_fastdeploy_startup import admit_through_the_engine

    return admit_through_the_engine(cfg, data)


@pytest.mark.parametrize("backend", ["auto", "xgrammar", "llguidance"])
@pytest.mark.parametrize("fields, named", SYNTAX, ids=[named for _, named in SYNTAX])
def test_syntax_errors_are_refused_by_the_engine_with_400_naming_the_position(model_dir, backend, fields, named):
    cfg = fe.engine_config(model_dir, guided_decoding_backend=backend)
    scheduled, responses = _admit(cfg, {"request_id": "bad-1", "prompt_token_ids": [1, 2, 3], **fields})
    assert scheduled == []
    [(request_id, [output])] = responses
    assert request_id == "bad-1" and output.finished and output.error_code == 400
    assert named in output.error_msg, output.error_msg


def test_older_drafts_keywords_without_schema_reach_the_runner(model_dir):
    cfg = fe.engine_config(model_dir, guided_decoding_backend="auto")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "dependencies": {"a": ["b"]}}
    scheduled, responses = _admit(cfg, {"request_id": "ok-1", "prompt_token_ids": [1, 2], "guided_json": schema})
    assert responses == [] and [r.request_id for r in scheduled] == ["ok-1"]
    assert json.loads(scheduled[0].guided_json)["dependencies"] == {"a": ["b"]}
