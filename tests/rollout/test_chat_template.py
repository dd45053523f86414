"""model.chat_template_kwargs reaches every engine's prompt rendering: a tiny model whose chat template
branches on `enable_thinking` (as Qwen3's does) renders other prompt ids with the flag off, the run's engines
render exactly those ids, and the vLLM engine renders the same ids as the HF engine."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from transformers import AutoTokenizer

from jobs.config import load_config
from jobs.driver.handles import build_handles
from jobs.models.builtin import CHATML_TEMPLATE
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from marl.tasks import get_family
from marl.types import Task
from rollout.engine import Sampling
from rollout.engine_group import _engine_kwargs
from rollout.hf_engine import HFEngine

# Qwen3's template writes an empty think block after the generation prompt when thinking is off.
THINKING_TEMPLATE = CHATML_TEMPLATE + (
    "{% if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 30?"}]
OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory) -> str:
    """builtin:tiny with the branching template (a copy: the cached folder stays as built)."""
    folder = tmp_path_factory.mktemp("thinking") / "tiny"
    shutil.copytree(resolve_model("builtin:tiny"), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = THINKING_TEMPLATE
    tokenizer.save_pretrained(folder)
    return str(folder)


def _render(path: str, **kwargs) -> list[int]:
    out = AutoTokenizer.from_pretrained(path).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs)
    return list(out)


def test_the_flag_changes_the_prompt_ids(thinking_model):
    tokenizer = AutoTokenizer.from_pretrained(thinking_model)
    off = _render(thinking_model, **OFF)
    assert tokenizer.decode(off).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = off[:-len("<think>\n\n</think>\n\n")]  # the character tokenizer: one id per character
    assert _render(thinking_model) == _render(thinking_model, enable_thinking=True) == on
    assert HFEngine(thinking_model, chat_template_kwargs=OFF).encode(MESSAGES) == off


def test_the_systems_engines_render_with_the_configs_kwargs(tmp_path, thinking_model):
    cfg = load_config(
        "jobs/configs/tiny.yaml",
        [
            f"out_dir={tmp_path}",
            f"model.path={thinking_model}",
            "marl.workflow=single_agent",
            "rollout.backend=hf",
            "rollout.engines_per_role=0",
            "learner.ranks=0",
            "rollout.torch_threads=1",
            "model.chat_template_kwargs.enable_thinking=false",
            "marl.sharing=shared",
        ],
    )
    handles = build_handles(run_layout(cfg), thinking_model, get_family("digit"))
    try:
        greedy = Sampling(temperature=0.0, max_new_tokens=2)
        out = asyncio.run(handles.engines["solver"].generate([MESSAGES], greedy, role="solver"))
        assert out[0].prompt_ids == _render(thinking_model, **OFF) != _render(thinking_model)
        task = Task(task_id="t", prompt="Write the digit 3.", answer="3")
        episode = handles.collector.collect([task], 1, Sampling(temperature=1.0, max_new_tokens=2)).episodes[
            0
        ]
        prompt = AutoTokenizer.from_pretrained(thinking_model).decode(episode.turns[0].completion.prompt_ids)
        assert prompt.endswith("assistant\n<think>\n\n</think>\n\n")
    finally:
        handles.shutdown()


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_every_backend_is_built_with_the_kwargs(backend):
    rollout = load_config("jobs/configs/tiny.yaml", [f"rollout.backend={backend}"]).rollout
    assert _engine_kwargs(rollout, 0, 0, False, OFF)["chat_template_kwargs"] == OFF
    assert "chat_template_kwargs" not in _engine_kwargs(rollout, 0, 0, False, {})  # the engines' default


@pytest.mark.vllm
def test_vllm_renders_the_hf_engines_ids(thinking_model):
    from rollout.vllm.engine import VLLMEngine

    engine = VLLMEngine(thinking_model, policy_id="pi", chat_template_kwargs=OFF, kv_cache_gb=0.25)
    requests = [MESSAGES, [{"role": "user", "content": "hi"}]]
    out = engine.generate(requests, Sampling(temperature=0.0, max_new_tokens=2))
    hf_off, hf_on = HFEngine(thinking_model, chat_template_kwargs=OFF), HFEngine(thinking_model)
    assert [c.prompt_ids for c in out] == [hf_off.encode(m) for m in requests]
    assert out[0].prompt_ids == _render(thinking_model, **OFF) != hf_on.encode(MESSAGES)
    assert len(out[0].response_ids) == 2  # vLLM generated from those ids
