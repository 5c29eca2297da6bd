"""Built-in op lists: trainplan's default policy and PyTorch's CUDA autocast lists, at aten level.

CUDA autocast (``aten/src/ATen/autocast_mode.cpp``; "CUDA Ops that can autocast to float16 / float32"
in the ``torch.amp`` docs) names ATen ops as called from Python. A make_fx training graph holds the
aten ops they dispatch to: ``layer_norm`` appears as ``native_layer_norm``, ``softmax`` as ``_softmax``
(``_safe_softmax`` when masked), ``nll_loss`` as ``nll_loss_forward``, ``scaled_dot_product_attention``
as ``_scaled_dot_product_flash_attention_for_cpu`` on CPU. The lists below are those names.
"""

from __future__ import annotations

from trainplan.precision.policy import Policy

# CUDA autocast lower_precision_fp (fp16) list: matmuls, convolutions, fused attention, RNN cells.
AUTOCAST_FP16 = (
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.addmv", "aten.addr",
    "aten.mv", "aten.matmul", "aten.linear", "aten.chain_matmul", "aten.linalg_multi_dot",
    "aten.convolution", "aten._convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d",
    "aten.conv_tbc", "aten.conv_transpose1d", "aten.conv_transpose2d", "aten.conv_transpose3d",
    "aten.prelu", "aten.lstm_cell", "aten.gru_cell", "aten.rnn_tanh_cell", "aten.rnn_relu_cell",
    "aten.scaled_dot_product_attention", "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
)

# Backward kernels of the fp16 ops: under autocast they run on the fp16 tensors the forward saved.
FP16_BACKWARD = (
    "aten.convolution_backward", "aten._scaled_dot_product_flash_attention_backward",
    "aten._scaled_dot_product_efficient_attention_backward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
)

# CUDA autocast fp32 list: transcendental functions, reductions, norms, softmax and losses.
AUTOCAST_FP32 = (
    "aten.acos", "aten.asin", "aten.cosh", "aten.erfinv", "aten.exp", "aten.expm1", "aten.log",
    "aten.log10", "aten.log2", "aten.log1p", "aten.reciprocal", "aten.rsqrt", "aten.sinh", "aten.tan",
    "aten.pow", "aten.softplus", "aten.native_layer_norm", "aten.native_group_norm",
    "aten.linalg_vector_norm", "aten.norm", "aten.frobenius_norm", "aten.nuclear_norm",
    "aten.cosine_similarity", "aten.poisson_nll_loss", "aten.cosine_embedding_loss",
    "aten.nll_loss_forward", "aten.nll_loss2d_forward", "aten.hinge_embedding_loss", "aten.kl_div",
    "aten.l1_loss", "aten.smooth_l1_loss", "aten.huber_loss", "aten.mse_loss",
    "aten.margin_ranking_loss", "aten.multilabel_margin_loss_forward", "aten.soft_margin_loss",
    "aten.triplet_margin_loss", "aten.multi_margin_loss", "aten.binary_cross_entropy_with_logits",
    "aten.dist", "aten._pdist_forward", "aten._cdist_forward", "aten.renorm", "aten.logsumexp",
    "aten.upsample_nearest2d", "aten.upsample_bilinear2d", "aten.prod", "aten.cumprod", "aten.cumsum",
    "aten.sum", "aten._softmax", "aten._safe_softmax", "aten._log_softmax",
)

# trainplan's default deny list: a strict subset of autocast's fp32 list (softmax, normalisation,
# losses, exp/log and running sums) plus the backward kernels of those ops. Everything else that
# autocast keeps in fp32 (pow, rsqrt, sum, ...) is left to infer, so the S1-S3 loop decides it.
DEFAULT_DENY = (
    "aten._softmax", "aten._safe_softmax", "aten._log_softmax", "aten.logsumexp",
    "aten._softmax_backward_data", "aten._log_softmax_backward_data",
    "aten.native_layer_norm", "aten.native_layer_norm_backward",
    "aten.native_group_norm", "aten.native_group_norm_backward",
    "aten.nll_loss_forward", "aten.nll_loss_backward", "aten.nll_loss2d_forward", "aten.nll_loss2d_backward",
    "aten.binary_cross_entropy_with_logits", "aten.mse_loss", "aten.exp", "aten.log", "aten.cumsum", "aten.cumprod",
)


def default_policy() -> Policy:
    """trainplan's built-in starting policy (the seed's built-in strategy step, before S1-S3)."""
    return Policy(allow=AUTOCAST_FP16 + FP16_BACKWARD, deny=DEFAULT_DENY, infer_mode="producer", name="default")


def autocast_policy() -> Policy:
    """PyTorch CUDA autocast emulated on an aten training graph.

    fp16 list (and its backward kernels) runs in fp16; the fp32 list applies to forward ops only
    (autocast does not act in backward); every other op promotes to the widest floating input,
    fp32 parameters included.
    """
    return Policy(
        allow=AUTOCAST_FP16 + FP16_BACKWARD,
        deny=AUTOCAST_FP32,
        deny_forward_only=True,
        infer_mode="promote",
        name="autocast",
    )
