"""Shared by all tests. Tests that start real SGLang workers live in tests/live/ and share its session fixtures;
test doubles live in tests/doubles/ (importable as ``doubles`` through the pytest ``pythonpath`` option)."""

import pytest

from sgl_moe.training import fixtures as model_fixtures


@pytest.fixture(scope="session")
def fixture_models_root(tmp_path_factory):
    """One folder per session for the test models built by ``sgl_moe.training.fixtures``."""
    return tmp_path_factory.mktemp("fixture-models")


@pytest.fixture(scope="session")
def qwen_model_dir(fixture_models_root):
    """The shipped weights behind a Qwen2-style byte-level BPE tokenizer with a Qwen3 ChatML template."""
    return model_fixtures.build("qwen", fixture_models_root)


@pytest.fixture(scope="session")
def llama_model_dir(fixture_models_root):
    """The shipped weights behind the shipped sentencepiece model as a Llama tokenizer (BOS) with [INST] chat."""
    return model_fixtures.build("llama", fixture_models_root)
