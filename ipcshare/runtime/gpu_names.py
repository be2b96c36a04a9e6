"""How messages name a GPU: its UUID as nvidia-smi prints it
(``GPU-7d9991a7-1c3b-c0a1-110d-e498594d6c74``, the form CUDA_VISIBLE_DEVICES takes too),
never the driver's 16 raw bytes. The one owner of that spelling; nothing here touches the
driver, so any layer may name a GPU."""

from __future__ import annotations

__all__ = ["format_uuid"]


def format_uuid(uuid: bytes | str) -> str:
    """nvidia-smi spelling of a GPU UUID: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``
    from the driver's 16 raw bytes (cuDeviceGetUuid); text (already spelled, as doctor
    facts carry it) is returned as it is. A MIG instance's UUID is spelled the same way."""
    if isinstance(uuid, str):
        return uuid
    text = bytes(uuid).hex()
    return f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"
