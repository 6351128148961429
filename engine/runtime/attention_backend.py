"""On CUDA, attention never goes to cuDNN: decoding asks for a new shape every step, and cuDNN plans each anew.

torch 2.11 on a Hopper GPU sends `scaled_dot_product_attention` in bfloat16 or float16 to cuDNN first, and cuDNN
builds an execution plan for every (query rows, cached keys) shape it has not seen. An eager decode grows its cache
by one or more tokens a step, so nearly every step is a new shape. On an H200 (bundled target, bfloat16, eager) the
first plain run of a prompt took 16-41 ms a step where its second run, those shapes planned by then, took 6.2-6.6
(later prompts, whose lengths earlier runs had planned, ran at 7-14); lookahead's and prompt lookup's verifies took 44
and 29 ms a step where a warm forward of 64 tokens took 6.8. float32 (which cuDNN's attention does not take) and the
compiled forward (a static cache: a few shapes, planned at warm-up) ran steadily. Flash and memory-efficient
attention need no plan and serve every shape decoding uses.
"""

from __future__ import annotations

import torch


def avoid_cudnn_attention(device: torch.device) -> bool:
    """Take cuDNN out of torch's attention backends when a model runs on CUDA (a process-wide setting: every model
    Glance loads attends through torch's sdpa). True where it changed something."""
    if device.type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True
