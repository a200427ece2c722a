"""The worker info message: what the worker encodes is what the router decodes; bad input names the field."""

import json

import pytest

from sgl_moe import DEFAULT_MODEL_DIR, saturation, wire
from sgl_moe.flops import FlopsModel
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.info import build_info, with_saturation


def _info(**overrides) -> wire.WorkerInfo:
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    f_ref = FlopsModel.from_hf_config(config).request_flops(0, 4096)
    args = dict(model_name="tiny", model_path=str(DEFAULT_MODEL_DIR), tokenizer_path=str(DEFAULT_MODEL_DIR),
                hf_config=config, instance_id="i1", context_length=4096, page_size=16, step_tokens=4096, dp_size=2,
                kv_events_config=json.dumps({"publisher": "zmq", "endpoint": "tcp://*:5557",
                                             "replay_endpoint": "tcp://*:6557", "topic": "kv"}),
                prefix_caching=True, device="cpu", sglang_version="0.5.23", moe=MoeArgs(),
                theta=saturation.without_transfer(f_ref, 4096, 1.0))
    return build_info(**{**args, **overrides})


def test_round_trip():
    info = _info()
    assert wire.decode_info(wire.encode(info)) == info
    assert wire.decode_info(json.loads(wire.encode(info))) == info


def test_json_shape_is_the_one_routers_read():
    data = json.loads(wire.encode(_info()))
    assert data["page_size"] == 16 and data["tokenizer"]["tokenizer_json_url"] == wire.TOKENIZER_PATH
    assert data["tokenizer"]["files"] == ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                          "config.json", "tokenizer.model"]
    assert [e["endpoint"] for e in data["kv_events"]] == ["tcp://*:5557", "tcp://*:5558"]  # port + DP rank
    assert [e["replay_endpoint"] for e in data["kv_events"]] == ["tcp://*:6557", "tcp://*:6558"]
    sat = data["saturation"]
    assert sat["state"] == "fixed" and sat["step_tokens"] == 4096 and sat["margin"] == 1.0
    assert data["moe_args"]["weight_streaming"] == "off"


def test_calibrated_theta_replaces_the_fallback_and_keeps_the_step():
    info = _info()
    theta = saturation.calibrated([{"layer": 0, "wall_s": 1.0, "wait_s": 0.0}, {"layer": 1, "wall_s": 2.0,
                                                                              "wait_s": 1.0}], 1e9, 512, 1.0)
    new = with_saturation(info, theta)
    assert new.saturation.state == "calibrated" and new.saturation.ratio == 2.0
    assert new.saturation.flops == 2e9 and new.saturation.step_tokens == 4096


@pytest.mark.parametrize("change,field", [({"page_size": "16"}, "page_size"), ({"flops": None}, "flops"),
                                          ({"saturation": {"flops": 1.0}}, "saturation")])
def test_a_bad_field_is_named(change, field):
    data = {**json.loads(wire.encode(_info())), **change}
    with pytest.raises(wire.WireError, match=field):
        wire.decode_info(data)


def test_missing_required_field_is_named():
    data = json.loads(wire.encode(_info()))
    del data["model_name"]
    with pytest.raises(wire.WireError, match="model_name"):
        wire.decode_info(json.dumps(data).encode())


def test_unknown_fields_are_ignored():
    """A newer worker may add fields; an older router still reads what it knows."""
    data = {**json.loads(wire.encode(_info())), "added_later": {"x": 1}}
    assert wire.decode_info(data) == _info()


def test_tokenizer_files_come_from_the_tokenizer_path(tmp_path):
    """SGLang loads the tokenizer from --tokenizer-path when given: the worker lists (and serves) that folder."""
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text("x")
    tok = _info(tokenizer_path=str(tmp_path)).tokenizer
    assert tok.path == str(tmp_path) and tok.tokenizer_config_url is None
    assert tok.files == ["tokenizer.json", "vocab.json", "additional_chat_templates/tool_use.jinja"]
    assert all(wire.is_tokenizer_file_name(name) for name in tok.files)


@pytest.mark.parametrize("name", ["model.safetensors", "../tokenizer.json", "/tokenizer.json", "sub/tokenizer.json",
                                  "additional_chat_templates/../x.jinja", "additional_chat_templates/a/b.jinja",
                                  "additional_chat_templates/x.txt", ""])
def test_only_tokenizer_file_names_are_served(name):
    assert not wire.is_tokenizer_file_name(name)


def test_info_from_a_worker_without_the_file_list_still_decodes():
    data = json.loads(wire.encode(_info()))
    del data["tokenizer"]["files"]
    assert wire.decode_info(data).tokenizer.files == []
