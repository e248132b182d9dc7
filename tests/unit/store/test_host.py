"""harness.store.host: what a run records about the machine that bears on its numbers."""

from harness.store.host import tf32_settings


def test_tf32_settings_and_the_environment_overrides_are_recorded(monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    settings = tf32_settings()
    assert settings["NVIDIA_TF32_OVERRIDE"] == "0" and settings["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"
    assert {"matmul", "cudnn", "float32_matmul_precision"} <= set(settings)
