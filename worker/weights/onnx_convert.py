"""Convert Kokoro-82M's int8 ONNX export into a state dict in the official `kokoro-v1_0.pth` layout.

The offline bundle (see `worker/weights/offline.py`) ships the model only as the kokoro-onnx project's
dynamic-int8 ONNX graph. This module reads that graph with the `onnx` package and rebuilds every
parameter of the official checkpoint, dequantized to float32:

- Weights are found through the node that consumes them, not through initializer names: the
  exporter named many initializers `onnx::MatMul_6548_3` or after the folded weight-norm product,
  but every node name carries the torch module scope (`/encoder/F0.1/conv1/Conv_quant` is
  `predictor.F0.1.conv1`).
- MatMulInteger: int8 weight `[in, out]` with a scale and zero point per output column;
  ConvInteger: uint8 weight with one scale and zero point per tensor; DynamicQuantizeLSTM: int8
  `W [2, in, 4H]` and `R [2, H, 4H]` (transposed against torch), one scale per direction, float
  bias `[2, 8H]` = `[W_b, R_b]`, gates in ONNX order i, o, f, c (torch wants i, f, g, o);
  embeddings: int8 + DequantizeLinear. Zero points are read from the node inputs, because the
  exporter shares one zero-point initializer among many weights.
- Weight-normed layers were folded to `W = g * v / ||v||` by the export; we store `weight_v = W`
  and `weight_g = ||W||` per output channel (dim 0, as `torch.nn.utils.weight_norm`), which gives
  back the same `W`. Channels that quantized to all zeros get `v = 1, g = 0` so the norm never
  divides by zero.
- Not in the graph: InstanceNorm affine parameters (the official checkpoint has none either) and
  `bert.pooler` (unused by Kokoro; filled with zeros so the ALBERT module loads strictly).

`convert_onnx(path)` returns `{component: {name: tensor}}` with the five official components.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where used, so reading CONVERTER_VERSION stays cheap
    import torch

# Bump when the output of `convert_onnx` changes, so cached conversions are redone.
CONVERTER_VERSION = 1

COMPONENTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")

# How many tensors each component of the full-size Kokoro-82M has in the official checkpoint.
EXPECTED_COUNTS = {"bert": 25, "bert_encoder": 2, "predictor": 122, "text_encoder": 24, "decoder": 375}

# Modules of the predictor that the exporter scoped directly under /encoder (F0Ntrain is a
# method call, so its submodules lost the `predictor` level of the scope).
_PREDICTOR_SCOPED_AT_TOP = re.compile(r"^(F0|N)(\.\d+|_proj)$|^shared$")

# Suffixes the quantizer appends to initializers it derived from a parameter.
_DERIVED_SUFFIXES = ("_quantized", "_scale", "_zero_point", "_reshape_shape")


class ConversionError(RuntimeError):
    """The ONNX graph does not have the layout this converter knows."""


def _component_prefix(initializer_name: str) -> tuple[str, str] | None:
    """`encoder.predictor.F0.1.pool.bias` -> ("predictor", "F0.1.pool.bias"); None if not a parameter name."""
    if initializer_name.startswith("decoder.decoder."):
        return "decoder", initializer_name[len("decoder.decoder."):]
    if initializer_name.startswith("encoder."):
        head, _, rest = initializer_name[len("encoder."):].partition(".")
        if head in COMPONENTS and rest:
            return head, rest
    return None


def module_path(node_name: str) -> tuple[str, str]:
    """The (component, module path) of the torch module a node belongs to, from its scope.

    `/encoder/text_encoder/cnn.0/cnn.0.0/Conv_quant`  -> ("text_encoder", "cnn.0.0")
    `/encoder/bert/encoder/albert_layer_groups.0/albert_layers.0/attention/query_3/MatMul_quant`
        -> ("bert", "encoder.albert_layer_groups.0.albert_layers.0.attention.query")
    `/encoder/shared/LSTM_quant` -> ("predictor", "shared")
    """
    scopes = node_name.strip("/").split("/")[:-1]  # drop the op's own name
    if len(scopes) < 2 or scopes[0] not in ("encoder", "decoder"):
        raise ConversionError(f"node {node_name!r} has no module scope")
    if scopes[0] == "decoder":
        if scopes[1] != "decoder":
            raise ConversionError(f"node {node_name!r}: unexpected scope under /decoder")
        component, rest = "decoder", scopes[2:]
    elif scopes[1] in COMPONENTS:
        component, rest = scopes[1], scopes[2:]
    elif _PREDICTOR_SCOPED_AT_TOP.match(scopes[1]):
        component, rest = "predictor", scopes[1:]
    else:
        raise ConversionError(f"node {node_name!r}: cannot tell which component scope {scopes[1]!r} is")
    parts: list[str] = []
    for scope in rest:
        # A repeated call of a shared module gets a counter (ALBERT runs one layer 12 times: query_3).
        scope = re.sub(r"_\d+$", "", scope)
        # nn.Sequential inside a ModuleList shows both levels (`cnn.0/cnn.0.0`): keep the inner one.
        if parts and scope.startswith(parts[-1] + "."):
            parts.pop()
        parts.append(scope)
    return component, ".".join(parts)


def _join(path: str, leaf: str) -> str:
    return f"{path}.{leaf}" if path else leaf


class _Graph:
    def __init__(self, path: Path):
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(path))
        self.graph = model.graph
        self.initializers = {t.name: t for t in self.graph.initializer}
        self._to_array = numpy_helper.to_array
        self._cache: dict[str, np.ndarray] = {}
        self.consumers: dict[str, list] = defaultdict(list)
        for node in self.graph.node:
            for name in node.input:
                self.consumers[name].append(node)

    def array(self, name: str) -> np.ndarray:
        if name not in self._cache:
            if name not in self.initializers:
                raise ConversionError(f"initializer {name!r} is missing")
            self._cache[name] = self._to_array(self.initializers[name])
        return self._cache[name]

    def is_initializer(self, name: str) -> bool:
        return name in self.initializers

    def scale_of(self, quantized_name: str) -> np.ndarray:
        # The quantizer names a weight's scale after the weight (zero points it shares; see module doc).
        return self.array(quantized_name[: -len("_quantized")] + "_scale").astype(np.float32)


def _dequantize(q: np.ndarray, zero_point: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (q.astype(np.float32) - zero_point.astype(np.float32)) * scale


def _weight_norm_parts(w: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """(weight_g, weight_v) with g * v / ||v|| == w, norm over all dims but 0 (torch's default)."""
    g = w.flatten(1).norm(dim=1).reshape(-1, *([1] * (w.dim() - 1)))
    dead = g.flatten() == 0
    v = w.clone()
    v[dead] = 1.0  # a channel that quantized to all zeros: any v works with g = 0, but not v = 0
    return g, v


def _lstm_params(graph: _Graph, node) -> dict[str, "torch.Tensor"]:
    """torch nn.LSTM parameters (bidirectional, one layer) from a DynamicQuantizeLSTM node."""
    import torch

    inputs = list(node.input)
    w_q, r_q, bias = (graph.array(inputs[i]) for i in (1, 2, 3))
    w_scale, w_zp, r_scale, r_zp = (graph.array(inputs[i]) for i in (8, 9, 10, 11))
    directions, _, four_h = w_q.shape
    if directions != 2 or r_q.shape[1] * 4 != four_h:
        raise ConversionError(f"{node.name}: expected a bidirectional LSTM, got W {w_q.shape}, R {r_q.shape}")
    hidden = four_h // 4
    # ONNX gate order i, o, f, c -> torch i, f, g(=c), o
    order = np.concatenate([np.arange(k * hidden, (k + 1) * hidden) for k in (0, 2, 3, 1)])
    out = {}
    for d, suffix in enumerate(("", "_reverse")):
        w = _dequantize(w_q[d], w_zp[d], w_scale[d]).T  # [4H, in]
        r = _dequantize(r_q[d], r_zp[d], r_scale[d]).T  # [4H, H]
        out[f"weight_ih_l0{suffix}"] = w[order]
        out[f"weight_hh_l0{suffix}"] = r[order]
        out[f"bias_ih_l0{suffix}"] = bias[d, :four_h][order]
        out[f"bias_hh_l0{suffix}"] = bias[d, four_h:][order]
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, order="C")) for k, v in out.items()}


def convert_onnx(path: str | Path, plbert_hidden: int = 768) -> dict[str, dict[str, "torch.Tensor"]]:
    """Rebuild the official state dict (float32) from the int8 ONNX export at `path`."""
    import torch

    graph = _Graph(Path(path))
    state: dict[str, dict[str, torch.Tensor]] = {c: {} for c in COMPONENTS}

    def put(component: str, key: str, value, origin: str) -> None:
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value, dtype=np.float32, order="C"))
        old = state[component].get(key)
        if old is not None and not (old.shape == tensor.shape and torch.equal(old, tensor)):
            raise ConversionError(f"{component}.{key} is produced twice with different values ({origin})")
        state[component][key] = tensor.to(torch.float32).contiguous()

    def weight_key(node, weight_name: str) -> tuple[str, str, bool]:
        """(component, key, weight_normed) for the weight input of a node."""
        base = weight_name[: -len("_quantized")] if weight_name.endswith("_quantized") else weight_name
        named = _component_prefix(base)
        if named and named[1].endswith(".weight"):
            return named[0], named[1], False
        component, path = module_path(node.name)
        # An unnamed conv weight is the folded product g * v / ||v|| of a weight-normed layer.
        return component, _join(path, "weight"), node.op_type in ("ConvInteger", "Conv", "ConvTranspose")

    # 1. Float parameters kept under their own names: biases, LayerNorms, snake alphas, ...
    for name, tensor in graph.initializers.items():
        if name.endswith(_DERIVED_SUFFIXES) or ".stft." in name:
            continue
        named = _component_prefix(name)
        if named and tensor.data_type == 1:  # FLOAT
            put(*named, graph.array(name), name)

    # 2. Weights, found through the nodes that consume them.
    for node in graph.graph.node:
        op, inputs = node.op_type, list(node.input)
        if op == "DynamicQuantizeLSTM":
            component, path = module_path(node.name)
            for key, value in _lstm_params(graph, node).items():
                put(component, _join(path, key), value, node.name)
            continue
        if op not in ("Gather", "MatMulInteger", "MatMul", "ConvInteger", "Conv", "ConvTranspose"):
            continue
        weight_index = 0 if op == "Gather" else 1
        if len(inputs) <= weight_index or not graph.is_initializer(inputs[weight_index]):
            continue
        weight_name = inputs[weight_index]
        if ".stft." in weight_name:  # the iSTFT basis of the export, not a model parameter
            continue
        q = graph.array(weight_name)
        if op == "Gather":
            if q.ndim != 2 or not weight_name.endswith("_quantized"):
                continue  # shape arithmetic, not an embedding table
            dequant = next(n for n in graph.consumers[node.output[0]] if n.op_type == "DequantizeLinear")
            w = _dequantize(q, graph.array(dequant.input[2]), graph.array(dequant.input[1]).astype(np.float32))
        elif op == "MatMulInteger":
            w = _dequantize(q, graph.array(inputs[3]), graph.scale_of(weight_name)).T  # [in, out] -> [out, in]
        elif op == "ConvInteger":
            w = _dequantize(q, graph.array(inputs[3]), graph.scale_of(weight_name))
        elif op == "MatMul":
            if q.ndim != 2:
                continue
            w = q.astype(np.float32).T
        else:  # float Conv / ConvTranspose
            w = q.astype(np.float32)
        component, key, weight_normed = weight_key(node, weight_name)
        if weight_normed:
            g, v = _weight_norm_parts(torch.from_numpy(np.array(w, dtype=np.float32, order="C")))
            put(component, key + "_g", g, node.name)
            put(component, key + "_v", v, node.name)
        else:
            put(component, key, w, node.name)

    # 3. Not in the graph: ALBERT's pooler, which Kokoro never runs.
    put("bert", "pooler.weight", torch.zeros(plbert_hidden, plbert_hidden), "pooler")
    put("bert", "pooler.bias", torch.zeros(plbert_hidden), "pooler")

    counts = {c: len(sd) for c, sd in state.items()}
    if counts != EXPECTED_COUNTS:
        raise ConversionError(f"converted tensor counts {counts} differ from the official layout {EXPECTED_COUNTS}")
    return state
