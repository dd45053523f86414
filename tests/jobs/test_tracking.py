"""Tracking sinks from config: TensorBoard by default, MLflow and W&B for real when enabled (file store,
offline), clear errors naming the key when their package is missing, and the console display."""

from __future__ import annotations

import io
import json
import sys

import pytest

from jobs.config import ConfigError, load_config
from jobs.telemetry.dashboard import STEP_METRIC
from jobs.telemetry.tracking import (
    MlflowSink,
    RunLog,
    StepDisplay,
    WandbSink,
    derived_metrics,
    read_metrics,
    require,
)

TINY = "jobs/configs/tiny.yaml"
ROLES = ["generator", "aggregator"]


def _step(reward: float) -> dict[str, float]:
    return {"reward/mean": reward, "reward/mean/generator": reward, "reward/mean/aggregator": 1 - reward,
            "rollout/tokens": 120.0, "time/rollout_s": 2.0, "time/update_s": 1.0, "time/sync_s": 0.1,
            "time/step_s": 3.1, "eval/accuracy": float("nan")}


@pytest.mark.parametrize("key", ["tracking.mlflow.enabled", "tracking.wandb.enabled"])
def test_a_missing_tracking_package_fails_at_config_load_naming_the_key(monkeypatch, key):
    module = key.split(".")[1]
    monkeypatch.setitem(sys.modules, module, None)  # what an uninstalled package looks like to the importer
    with pytest.raises(ConfigError, match=rf"{key}=true needs the `{module}` package"):
        load_config(TINY, [f"{key}=true"])
    with pytest.raises(ConfigError, match=rf"{key}=true needs the `{module}` package"):
        require(module, key)


def test_tracking_options_are_validated():
    with pytest.raises(ConfigError, match=r"tracking\.wandb\.mode"):
        load_config(TINY, ["tracking.wandb.mode=cloud"])
    with pytest.raises(ConfigError, match=r"tracking\.progress"):
        load_config(TINY, ["tracking.progress=fancy"])
    with pytest.raises(ConfigError, match=r"tracking\.mlflow\.nope"):
        load_config(TINY, ["tracking.mlflow.nope=1"])


def test_default_run_log_writes_jsonl_tensorboard_and_dashboard_metrics(tmp_path):
    cfg = load_config(TINY, [f"out_dir={tmp_path}", "tracking.progress=line"])
    log = RunLog.for_run(tmp_path, cfg, ROLES)
    assert [type(s).__name__ for s in log.sinks] == ["TensorBoardSink", "RayMetricsSink"]
    log.log(0, _step(0.25))
    log.close()
    row = read_metrics(tmp_path)[0]
    assert row["step"] == 0 and row["rollout/tokens_per_s"] == 60.0  # derived: tokens / rollout seconds
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert STEP_METRIC in log.sinks[1]._metrics  # the sink created (and set) its Ray metrics


def test_derived_rates_never_override_a_reported_one():
    assert derived_metrics({"rollout/tokens": 10.0, "time/rollout_s": 0.0}) == {}
    assert derived_metrics({"rollout/tokens": 10.0, "time/rollout_s": 2.0, "rollout/tokens_per_s": 1.0}) == {}


def test_mlflow_run_gets_params_and_per_step_metrics(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 wants a database unless told otherwise
    uri = (tmp_path / "mlruns").as_uri()
    cfg = load_config(
        TINY,
        [
            f"out_dir={tmp_path}",
            "tracking.mlflow.enabled=true",
            f"tracking.mlflow.uri={uri}",
            "tracking.tensorboard=false",
            "tracking.ray_metrics=false",
            "tracking.progress=line",
        ],
    )
    log = RunLog.for_run(tmp_path, cfg, ROLES)
    sink = log.sinks[0]
    assert isinstance(sink, MlflowSink)
    log.log(0, _step(0.25))
    log.log(1, _step(0.75))
    log.close()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(sink.run_id)
    assert run.info.run_name == "tiny" and run.info.status == "FINISHED"
    assert run.data.params["marl.workflow"] == "voting" and run.data.params["model.path"] == "builtin:tiny"
    # A file store cannot hold both reward/mean and reward/mean/<role> (file vs folder): keys use "." there.
    history = client.get_metric_history(sink.run_id, "reward.mean.generator")
    assert [(m.step, m.value) for m in history] == [(0, 0.25), (1, 0.75)]
    assert run.data.metrics["reward.mean"] == 0.75
    assert "eval.accuracy" not in run.data.metrics  # NaN (no eval this step) is not sent
    second = MlflowSink(uri, cfg.tracking.mlflow.experiment, "another", {})  # joins the existing experiment
    second.close()
    assert client.get_run(second.run_id).info.experiment_id == run.info.experiment_id


def test_wandb_offline_run_logs_each_step(tmp_path):
    cfg = load_config(
        TINY,
        [
            f"out_dir={tmp_path}",
            "tracking.wandb.enabled=true",
            "tracking.wandb.mode=offline",
            "tracking.wandb.run_name=w1",
            "tracking.tensorboard=false",
            "tracking.ray_metrics=false",
            "tracking.progress=line",
        ],
    )
    log = RunLog.for_run(tmp_path, cfg, ROLES)
    sink = log.sinks[0]
    assert isinstance(sink, WandbSink)
    run = sink.run
    assert run.name == "w1" and run.config["marl.sharing"] == "isolated"
    log.log(0, _step(0.25))
    log.log(1, _step(0.75))
    assert run.summary["reward/mean/generator"] == 0.75 and run.summary["_step"] == 1
    log.close()
    offline = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_line_per_step_when_not_a_terminal():
    out = io.StringIO()
    display = StepDisplay(3, ROLES, "auto", out)
    display.episodes(2, 8)  # no bar: nothing to draw
    display.step_done(0, _step(0.25))
    display.step_done(1, _step(0.5))
    display.close()
    lines = out.getvalue().splitlines()
    assert [line.split()[:2] for line in lines] == [["step", "1/3"], ["step", "2/3"]]
    assert "generator=0.25 aggregator=0.75" in lines[0] and "rollout 2.0s" in lines[0]


def test_progress_bar_on_a_terminal_shows_steps_and_episodes():
    out = _Terminal()
    display = StepDisplay(3, ROLES, "auto", out, mininterval=0)  # redraw on every update
    display.episodes(4, 8)
    assert "4/8" in out.getvalue() and "episode" in out.getvalue()
    display.episodes(8, 8)  # done: the inner bar goes away
    assert display._episodes is None
    display.step_done(0, _step(0.25))
    display.step_done(2, _step(0.5))  # a resumed run may skip ahead
    display.close()
    text = out.getvalue()
    assert "3/3" in text and "generator=0.50" in text and "step 1/3" not in text


def test_terminal_without_tqdm_falls_back_to_lines(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    out = _Terminal()
    display = StepDisplay(2, ROLES, "auto", out)
    display.step_done(0, _step(0.25))
    assert out.getvalue().startswith("step 1/2")


def test_read_metrics_round_trip(tmp_path):
    log = RunLog(tmp_path, tensorboard=False)
    log.log(4, {"a": 1.0})
    log.close()
    assert read_metrics(tmp_path) == [{"step": 4, "a": 1.0}]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 4, "a": 1.0}


@pytest.mark.parametrize("verbose", [False, True])
def test_quiet_logs_sets_engine_log_levels_unless_verbose_and_user_settings_win(monkeypatch, verbose):
    from jobs.train import quiet_logs
    from rollout.vllm.support import engine_env

    for key in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS", "DS_ACCELERATOR"):
        monkeypatch.setenv(key, "")  # recorded, so whatever quiet_logs sets is undone after the test
        monkeypatch.delenv(key)
    monkeypatch.setattr("warnings.filters", list(__import__("warnings").filters))  # undone after the test
    quiet_logs(verbose)
    env = engine_env("nobind", "/tmp/cache")  # what an engine actor starts with
    if verbose:
        assert env["VLLM_LOGGING_LEVEL"] == "INFO" and "TORCH_CPP_LOG_LEVEL" not in env
    else:
        assert env["VLLM_LOGGING_LEVEL"] == "ERROR" and env["TORCH_CPP_LOG_LEVEL"] == "ERROR"
        assert env["PYTHONWARNINGS"] == "ignore::FutureWarning"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    quiet_logs(verbose)
    assert engine_env("nobind", "/tmp/cache")["VLLM_LOGGING_LEVEL"] == "DEBUG"
