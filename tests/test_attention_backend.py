"""cuDNN attention is switched off for models on CUDA only (engine/runtime/attention_backend.py)."""

import pytest
import torch

from engine.runtime.attention_backend import avoid_cudnn_attention


@pytest.fixture
def cudnn_flag():
    """Restore torch's process-wide cuDNN attention flag after the test."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_cuda_model_turns_cudnn_attention_off(cudnn_flag):
    torch.backends.cuda.enable_cudnn_sdp(True)
    assert avoid_cudnn_attention(torch.device("cuda"))
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert not avoid_cudnn_attention(torch.device("cuda"))  # already off: nothing to change


def test_cpu_model_leaves_the_backends_alone(cudnn_flag):
    torch.backends.cuda.enable_cudnn_sdp(True)
    assert not avoid_cudnn_attention(torch.device("cpu"))
    assert torch.backends.cuda.cudnn_sdp_enabled()
