"""What an engine says of how it runs (`Engine.run_report`), its switches, and the per-thread choice
of the fused CPU kernels that lets a replica serve eagerly while another thread compiles them."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from worker.compile_cache import CompileRecord, device_name
from worker.engine import Engine, EngineConfig, EnginePasses
from worker.model import layers


def test_a_cpu_engine_reports_how_it_runs(tiny_weights):
    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32", fused_kernels=False))
    report = json.loads(json.dumps(engine.run_report()))  # JSON-ready as it is
    assert report["device"] == "cpu" and report["card"] == device_name(torch.device("cpu"))
    assert report["torch"] == torch.__version__ and report["dtype"] == "fp32"
    assert report["compiled"] is False and report["stage2"] == "exact" and report["kernels"] == "eager"
    for family in ("single", "batch"):  # no CUDA: no graphs wanted, none captured, no error
        assert report["graphs"][family] == {"wanted": False, "captured": 0, "error": None, "replays": 0,
                                            "beyond_grid": 0}
    assert report["compile"] is None
    engine.synthesize([16, 43, 54], tiny_weights.voices[next(iter(tiny_weights.voices))][2])
    assert engine.run_report()["graphs"]["single"]["replays"] == 0


def test_the_compile_record_reports_its_counts_json_ready(tmp_path):
    record = CompileRecord(tmp_path, dynamo_compiles=2, graphs_compiled=2, recompiles=["decode: a guard failed"])
    as_dict = json.loads(json.dumps(record.as_dict()))
    assert as_dict["directory"] == str(tmp_path) and as_dict["loaded"] is False
    assert {"loaded", "seconds", "waited_s", "graphs_compiled", "graphs_loaded", "dynamo_compiles",
            "recompiles"} <= set(as_dict)
    assert "1 recompile(s): decode: a guard failed" in record.describe()


def test_stage2_takes_three_arithmetics_and_nothing_else(tiny_weights):
    for mode in ("exact", "exact-nondeterministic", "fast"):
        assert Engine(tiny_weights, EngineConfig("cpu", "fp32", fused_kernels=False, stage2=mode)).run_report()["stage2"] == mode
    with pytest.raises(ValueError, match="exact-nondeterministic"):
        Engine(tiny_weights, EngineConfig("cpu", "fp32", fused_kernels=False, stage2="tf32"))


def test_a_cpu_engine_runs_eager_kernels_until_its_compiled_ones_are_switched_in(tiny_weights):
    """Fused kernels wanted, not compiled yet: the engine serves with the eager ones, and says so."""
    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32"))
    assert engine.fused_kernels and engine.kernels_pending and engine.kernels == "eager"
    assert not engine.switch_to_compiled_kernels()  # nothing compiled: nothing to switch to
    engine.synthesize([16, 43, 54], tiny_weights.voices[next(iter(tiny_weights.voices))][2])
    assert not layers.kernels.compiled  # the synthesis ran the eager kernels


def test_the_fused_kernel_choice_is_each_threads_own():
    """One thread serving eagerly while another runs (and compiles) the fused kernels."""
    seen = {}
    chosen, check = threading.Event(), threading.Event()

    def compiling_thread():
        layers.use_compiled_kernels(True)
        chosen.set()
        check.wait(5)
        seen["other"] = layers.kernels.compiled

    layers.use_compiled_kernels(False)
    other = threading.Thread(target=compiling_thread)
    other.start()
    chosen.wait(5)
    seen["this"] = layers.kernels.compiled
    check.set()
    other.join()
    assert seen == {"this": False, "other": not layers.kernels.broken}


@pytest.mark.parametrize("device, config, passes", [
    ("cpu", EngineConfig("cpu", "fp32"), EnginePasses("fp32", False, "fused", False, False)),
    ("cpu", EngineConfig("cpu", "int8", compiled=True), EnginePasses("int8", False, "fused", False, False)),
    ("cpu", EngineConfig("cpu", "fp32", compiled=True, fused_kernels=True), EnginePasses("fp32", False, "compiled",
                                                                                         False, False)),
    ("cpu", EngineConfig("cpu", "bf16", fused_kernels=False, bucketed=True), EnginePasses("bf16", True, "eager",
                                                                                          False, False)),
    ("cuda", EngineConfig("cuda", "auto"), EnginePasses("bf16", True, "compiled", True, False)),
    ("cuda", EngineConfig("cuda", "auto", max_batch=8), EnginePasses("bf16", True, "compiled", True, True)),
    ("cuda", EngineConfig("cuda", "fp32", compiled=False, max_batch=8), EnginePasses("fp32", True, "eager", True,
                                                                                      False)),
    ("cuda", EngineConfig("cuda", "fp16", cuda_graphs=False, batch_graphs=True, max_batch=8, batch_graph_frames=0),
     EnginePasses("fp16", True, "compiled", False, False)),
])
def test_the_passes_an_engine_runs_are_chosen_once_from_its_config_and_device(device, config, passes):
    """No model, no device needed: the choice is a function of the config and the device's kind."""
    assert EnginePasses.choose(config, torch.device(device)) == passes
