"""The official source: `config.json`, `kokoro-v1_0.pth` and `voices/*.pt` of `hexgrad/Kokoro-82M`
from a directory (`KOKORO_WEIGHTS_DIR`, `KOKORO_WEIGHTS=/some/dir`, or `<cache>/official`, where
`download_official` puts them; image builds call it, with pinned hashes)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Sequence

from worker.weights.common import (COMPONENTS, STYLE_WIDTH, VOICE_NAMES, VOICE_ROWS, Weights, WeightsError,
                                   WeightsSource, atomic_path, log, sha256_file)

# --- official files: hexgrad/Kokoro-82M at a pinned revision ---
OFFICIAL_REPO = "hexgrad/Kokoro-82M"
OFFICIAL_REVISION = "f3ff3571791e39611d31c381e3a41a3af07b4987"
OFFICIAL_MODEL = "kokoro-v1_0.pth"
OFFICIAL_SHA256: dict[str, str] = {
    "config.json": "5abb01e2403b072bf03d04fde160443e209d7a0dad49a423be15196b9b43c17f",
    "kokoro-v1_0.pth": "496dba118d1a58f5f3db2efc88dbdc216e0483fc89fe6e47ee1f2c53f18ad1e4",
    "voices/af_alloy.pt": "6d877149dd8b348fbad12e5845b7e43d975390e9f3b68a811d1d86168bef5aa3",
    "voices/af_aoede.pt": "c03bd1a4c3716c2d8eaa3d50022f62d5c31cfbd6e15933a00b17fefe13841cc4",
    "voices/af_bella.pt": "8cb64e02fcc8de0327a8e13817e49c76c945ecf0052ceac97d3081480e8e48d6",
    "voices/af_heart.pt": "0ab5709b8ffab19bfd849cd11d98f75b60af7733253ad0d67b12382a102cb4ff",
    "voices/af_jessica.pt": "cdfdccb8cc975aa34ee6b89642963b0064237675de0e41a30ae64cc958dd4e87",
    "voices/af_kore.pt": "8bfbc512321c3db49dff984ac675fa5ac7eaed5a96cc31104d3a9080e179d69d",
    "voices/af_nicole.pt": "c5561808bcf5250fe8c5f5de32caf2d94f27e57e95befdb098c5c85991d4c5da",
    "voices/af_nova.pt": "e0233676ddc21908c37a1f102f6b88a59e4e5c1bd764983616eb9eda629dbcd2",
    "voices/af_river.pt": "e149459bd9c084416b74756b9bd3418256a8b839088abb07d463730c369dab8f",
    "voices/af_sarah.pt": "49bd364ea3be9eb3e9685e8f9a15448c4883112a7c0ff7ab139fa4088b08cef9",
    "voices/af_sky.pt": "c799548aed06e0cb0d655a85a01b48e7f10484d71663f9a3045a5b9362e8512c",
    "voices/am_adam.pt": "ced7e284aba12472891be1da3ab34db84cc05cc02b5889535796dbf2d8b0cb34",
    "voices/am_echo.pt": "8bcfdc852bc985fb45c396c561e571ffb9183930071f962f1b50df5c97b161e8",
    "voices/am_eric.pt": "ada66f0eefff34ec921b1d7474d7ac8bec00cd863c170f1c534916e9b8212aae",
    "voices/am_fenrir.pt": "98e507eca1db08230ae3b6232d59c10aec9630022d19accac4f5d12fcec3c37a",
    "voices/am_liam.pt": "c82550757ddb31308b97f30040dda8c2d609a9e2de6135848d0a948368138518",
    "voices/am_michael.pt": "9a443b79a4b22489a5b0ab7c651a0bcd1a30bef675c28333f06971abbd47bd37",
    "voices/am_onyx.pt": "e8452be16cd0f6da7b4579eaf7b1e4506e92524882053d86d72b96b9a7fed584",
    "voices/am_puck.pt": "dd1d8973f4ce4b7d8ae407c77a435f485dabc052081b80ea75c4f30b84f36223",
    "voices/am_santa.pt": "7f2f7582fa2b1f160e90aafe6d0b442a685e773608b6667e545d743b073e97a7",
    "voices/bf_alice.pt": "d292651b6af6c0d81705c2580dcb4463fccc0ff7b8d618a471dbb4e45655b3f3",
    "voices/bf_emma.pt": "d0a423deabf4a52b4f49318c51742c54e21bb89bbbe9a12141e7758ddb5da701",
    "voices/bf_isabella.pt": "cdd4c37003805104d1d08fb1e05855c8fb2c68de24ca6e71f264a30aaa59eefd",
    "voices/bf_lily.pt": "6e09c2e481e2d53004d7e5ae7d3a325369e130a6f45c35a6002de75084be9285",
    "voices/bm_daniel.pt": "fc3fce4e9c12ed4dbc8fa9680cfe51ee190a96444ce7c3ad647549a30823fc5d",
    "voices/bm_fable.pt": "d44935f3135257a9064df99f007fc1342ff1aa767552b4a4fa4c3b2e6e59079c",
    "voices/bm_george.pt": "f1bc812213dc59774769e5c80004b13eeb79bd78130b11b2d7f934542dab811b",
    "voices/bm_lewis.pt": "b5204750dcba01029d2ac9cec17aec3b20a6d64073c579d694a23cb40effbd0e",
    "voices/ef_dora.pt": "d9d69b0f8a2b87a345f269d89639f89dfbd1a6c9da0c498ae36dd34afcf35530",
    "voices/em_alex.pt": "5eac53f767c3f31a081918ba531969aea850bed18fe56419b804d642c6973431",
    "voices/em_santa.pt": "aa8620cb96cec705823efca0d956a63e158e09ad41aca934d354b7f0778f63cb",
    "voices/ff_siwis.pt": "8073bf2d2c4b9543a90f2f0fd2144de4ed157e2d4b79ddeb0d5123066171fbc9",
    "voices/hf_alpha.pt": "06906fe05746d13a79c5c01e21fd7233b05027221a933c9ada650f5aafc8f044",
    "voices/hf_beta.pt": "63c0a1a6272e98d43f4511bba40e30dd9c8ceaf5f39af869509b9f51a71c503e",
    "voices/hm_omega.pt": "b55f02a8e8483fffe0afa566e7d22ed8013acf47ad4f6bbee2795a840155703e",
    "voices/hm_psi.pt": "2f0f055cea4f1083f4ef127ece48d71606347f6557dbb961c0ca5740a2da485b",
    "voices/if_sara.pt": "6c0b253b955fe32f1a1a86006aebe83d050ea95afd0e7be15182f087deedbf55",
    "voices/im_nicola.pt": "234ed06648649f9bd874b37508ea17560b9c993ef85b4ddb3e3a71e062bd2c12",
    "voices/jf_alpha.pt": "1bf4c9dc69e45ee46183b071f4db766349aac5592acbcfeaf051018048a5d787",
    "voices/jf_gongitsune.pt": "1b171917f18f351e65f2bf9657700cd6bfec4e65589c297525b9cf3c20105770",
    "voices/jf_nezumi.pt": "d83f007a7f01783b77014561a7d493d327a0210e143440e91c9b697590d27661",
    "voices/jf_tebukuro.pt": "0d6917904438aec85f73a6fa1f7ac2be6481aae47c697834936930a91796c576",
    "voices/jm_kumo.pt": "98340afd68b1cee84fe0cd95528cfa6d4b39e416aa75a9df64049d52c8b55896",
    "voices/pf_dora.pt": "07e4ff987c5d5a8c3995efd15cc4f0db7c4c15e881b198d8ab7f67ecf51f5eb7",
    "voices/pm_alex.pt": "cf0ba8c573c2480fc54123683a35cf1e2ae130428e441eb91f9149bdb188a526",
    "voices/pm_santa.pt": "d42103169c5c872abbafb9129133af7e942bb9d272c3cc3b95c203e7d7198c29",
    "voices/zf_xiaobei.pt": "9b76be63dab4f4f96962030acc0126a9aee9728608fbbe115e2b58a2bd504df6",
    "voices/zf_xiaoni.pt": "95b49f169bf1640f4f43c25e13daa39f7b98d15d00823e83ef5c14b3ced59e49",
    "voices/zf_xiaoxiao.pt": "cfaf6f2ded1ee56f1ff94fcd2b0e6cdf32e5b794bdc05b44e7439d44aef5887c",
    "voices/zf_xiaoyi.pt": "b5235dbaeef85a4c613bf78af9a88ff63c25bac5f26ba77e36186d8b7ebf05e2",
    "voices/zm_yunjian.pt": "76cbf8bad35901d011d9628a2fdceb7b4f1f127e7a3269cb393b3941eb7fc417",
    "voices/zm_yunxi.pt": "dbe6e1ce7c3dbaf2f5667432947b638b1c6831ccbe154c4610dbcc44f431e27b",
    "voices/zm_yunxia.pt": "bb2b03b08e84d64e1214440ce3b624987fac177f2eeb5bab8571799a3d980acd",
    "voices/zm_yunyang.pt": "5238ac22e0c7f8b6cdd2eddd6e444b8a700b73c4674d9a047d59a94ff96379a2",
}



def official_dir(source: WeightsSource) -> Path:
    if source.kind not in ("offline", "official", "tiny", "random-full"):
        return Path(source.kind).expanduser()
    if source.directory:
        return Path(source.directory).expanduser()
    return Path(source.cache_dir).expanduser() / "official"


def load_official(directory: str | Path, serving_dir: Path | None = None) -> Weights:
    """`config.json`, `kokoro-v1_0.pth` and `voices/*.pt` as hexgrad/Kokoro-82M lays them out."""
    import torch

    directory = Path(directory)
    missing = [n for n in ("config.json", OFFICIAL_MODEL, "voices") if not (directory / n).exists()]
    if missing:
        raise WeightsError(f"{directory} lacks {', '.join(missing)} of the official Kokoro-82M files; fetch them "
                           f"with `kokoro-fleet weights --download-official {directory}`, or use KOKORO_WEIGHTS=offline")
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        raw = torch.load(directory / OFFICIAL_MODEL, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise WeightsError(f"cannot read {directory / OFFICIAL_MODEL}: {exc}") from None
    absent = [c for c in COMPONENTS if c not in raw]
    if absent:
        raise WeightsError(f"{directory / OFFICIAL_MODEL} has no {', '.join(absent)} component(s); is it kokoro-v1_0.pth?")
    state_dict = {c: {k.removeprefix("module."): v for k, v in raw[c].items()} for c in COMPONENTS}
    voices = {}
    for path in sorted((directory / "voices").glob("*.pt")):
        pack = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # shared pages, as the model's
        pack = pack.reshape(pack.shape[0], -1) if pack.dim() == 3 else pack  # [510, 1, 256] -> [510, 256]
        if tuple(pack.shape) != (VOICE_ROWS, STYLE_WIDTH):
            raise WeightsError(f"{path} has shape {tuple(pack.shape)}, expected [{VOICE_ROWS}, 1, {STYLE_WIDTH}]")
        voices[path.stem] = pack.to(torch.float32).contiguous()
    if not voices:
        raise WeightsError(f"{directory / 'voices'} holds no voice (*.pt) files")
    info = {"source": "official", "path": str(directory), "repo": OFFICIAL_REPO,
            "config_sha256": sha256_file(directory / "config.json"),
            "pinned_sha256": {k: OFFICIAL_SHA256[k] for k in ("config.json", OFFICIAL_MODEL)},
            "voice_count": len(voices)}
    return Weights("official", config, state_dict, voices, info, serving_dir=serving_dir,
                   fingerprint=official_fingerprint(directory / OFFICIAL_MODEL))


def official_fingerprint(model: Path) -> str:
    """Names the checkpoint's content by its path, size and modification time: it changes with the
    file, without hashing 330 MB at every start."""
    model = model.resolve()
    stat = model.stat()
    return "official-" + hashlib.sha256(f"{model}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def download_official(dest: str | Path, voices: Sequence[str] = VOICE_NAMES,
                      revision: str = OFFICIAL_REVISION) -> Path:
    """Fetch the official files from the hub into `dest` and check their pinned SHA-256s.
    Only image builds call this (it needs hub access and `huggingface_hub`)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise WeightsError("download_official needs huggingface_hub: `pip install huggingface_hub`") from None
    dest = Path(dest)
    for name in ["config.json", OFFICIAL_MODEL, *(f"voices/{v}.pt" for v in voices)]:
        target = dest / name
        expected = OFFICIAL_SHA256.get(name)
        if target.is_file() and expected and sha256_file(target) == expected:
            continue
        log(f"downloading {OFFICIAL_REPO}/{name} @ {revision[:10]}")
        fetched = Path(hf_hub_download(OFFICIAL_REPO, name, revision=revision))
        digest = sha256_file(fetched)
        if expected and digest != expected:
            raise WeightsError(f"{OFFICIAL_REPO}/{name} has sha256 {digest}, expected {expected}")
        with atomic_path(target) as tmp:
            shutil.copyfile(fetched, tmp)
    return dest
