"""Check that stoker's deterministic transforms match torchvision's within 1/255.

Needs torchvision (kept out of stoker's test suite on purpose); run it where it is installed::

    PYTHON benchmarks/check_transforms_vs_torchvision.py

(``PYTHON``: an interpreter with torchvision and stoker's dependencies.)

Every case feeds the same PIL image to both libraries, converts both outputs with their own
ToTensor, and reports the largest absolute difference in [0, 1] units. Random transforms
are pinned to one outcome (p=1, a degenerate range). The last cases compare stoker's
ImageFolder fast path (fused JPEG decode) with torchvision's ImageFolder. Exit status 1 if
any case exceeds 1/255.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

TOLERANCE = 1.0 / 255.0 + 1e-6  # 1/255, plus float32 rounding of the [0, 1] values
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _photo(h: int, w: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8))
    arr = np.asarray(small.resize((w, h), Image.Resampling.BICUBIC)).astype(np.int16)
    return Image.fromarray(np.clip(arr + rng.integers(-12, 13, (h, w, 3)), 0, 255).astype(np.uint8))


def cases(S: Any, V: Any) -> list[tuple[str, Any, Any]]:
    """(name, stoker transform, torchvision transform) pairs with deterministic outcomes."""
    pairs = []

    def add(name: str, make: Any) -> None:
        pairs.append((name, make(S), make(V)))

    add("Resize(64)", lambda M: M.Resize(64))
    add("Resize((50, 70))", lambda M: M.Resize((50, 70)))
    add("Resize(300) upscale", lambda M: M.Resize(300))
    add("Resize(40, bicubic)", lambda M: M.Resize(40, M.InterpolationMode.BICUBIC))
    add("Resize(40, nearest)", lambda M: M.Resize(40, M.InterpolationMode.NEAREST))
    add("Resize(100, max_size=120)", lambda M: M.Resize(100, max_size=120))
    add("CenterCrop(64)", lambda M: M.CenterCrop(64))
    add("CenterCrop((99, 31))", lambda M: M.CenterCrop((99, 31)))
    add("CenterCrop(300) pads", lambda M: M.CenterCrop(300))
    for mode in ("constant", "edge", "reflect", "symmetric"):
        add(f"Pad((3, 5), {mode})", lambda M, m=mode: M.Pad((3, 5), fill=7, padding_mode=m))
    add("Pad((1, 2, 3, 4))", lambda M: M.Pad((1, 2, 3, 4), fill=(10, 20, 30)))
    add("RandomHorizontalFlip(1)", lambda M: M.RandomHorizontalFlip(1.0))
    add("RandomVerticalFlip(1)", lambda M: M.RandomVerticalFlip(1.0))
    add("Grayscale(1)", lambda M: M.Grayscale(1))
    add("Grayscale(3)", lambda M: M.Grayscale(3))
    add("RandomRotation((30, 30))", lambda M: M.RandomRotation((30, 30)))
    add(
        "RandomRotation((-17, -17), bilinear, expand)",
        lambda M: M.RandomRotation((-17, -17), M.InterpolationMode.BILINEAR, expand=True),
    )
    add("ColorJitter(brightness=1.4)", lambda M: M.ColorJitter(brightness=(1.4, 1.4)))
    add("ColorJitter(contrast=0.6)", lambda M: M.ColorJitter(contrast=(0.6, 0.6)))
    add("ColorJitter(saturation=1.7)", lambda M: M.ColorJitter(saturation=(1.7, 1.7)))
    add("ColorJitter(hue=0.2)", lambda M: M.ColorJitter(hue=(0.2, 0.2)))
    add("ColorJitter(hue=-0.3)", lambda M: M.ColorJitter(hue=(-0.3, -0.3)))
    add(
        "RandomResizedCrop full-frame",
        lambda M: M.RandomResizedCrop((90, 120), scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3)),
    )
    add(
        "Resize+CenterCrop+Normalize",
        lambda M: M.Compose([M.Resize(72), M.CenterCrop(64), M.ToTensor(), M.Normalize(MEAN, STD)]),
    )
    return pairs


RESAMPLE_CASES = [  # (name, source h x w x channels, output h x w, crop (top, left, h, w) or None)
    ("down 375x500 -> 224x224", (375, 500, 3), (224, 224), None),
    ("down 300x400 crop -> 224", (375, 500, 3), (224, 224), (31, 57, 300, 400)),
    ("up 60x80 -> 224x224", (60, 80, 3), (224, 224), None),
    ("up and down 150x90 -> 97x131", (150, 90, 3), (97, 131), None),
    ("odd 101x77 -> 33x59", (101, 77, 3), (33, 59), None),
    ("odd 37x211 -> 211x37", (37, 211, 3), (211, 37), None),
    ("1xN 1x500 -> 1x37", (1, 500, 3), (1, 37), None),
    ("Nx1 500x1 -> 37x1", (500, 1, 3), (37, 1), None),
    ("1xN up 1x40 -> 7x300", (1, 40, 3), (7, 300), None),
    ("extreme 17x600 -> 224x224", (17, 600, 3), (224, 224), None),
    ("extreme 600x9 -> 224x224", (600, 9, 3), (224, 224), None),
    ("1-pixel crop -> 224x224", (150, 200, 3), (224, 224), (70, 90, 1, 1)),
    ("1x2-pixel crop -> 5x9", (150, 200, 3), (5, 9), (10, 20, 1, 2)),
    ("greyscale down 375x500 -> 224x224", (375, 500, 1), (224, 224), None),
    ("greyscale up 31x45 -> 100x64", (31, 45, 1), (100, 64), None),
    ("greyscale 1-pixel crop -> 8x8", (31, 45, 1), (8, 8), (3, 4, 1, 1)),
]


def check_resampler(V: Any, F: Any, torch: Any) -> float:
    """Print stoker's C resampler against torchvision (PIL and tensor); the worst PIL
    difference in [0, 1] units (tensors are reported, within 1/255 of PIL by torch's own
    rounding of its weights to 16 bits)."""
    from stoker.vision import _fused

    native = _fused._native
    if native is None:
        print("stoker's C resampler is not built here: nothing to compare.")
        return 0.0
    print(f"stoker's C resampler ({native.RESAMPLE_KERNEL}) vs torchvision resize")
    worst = 0.0
    modes = [
        ("bilinear", V.InterpolationMode.BILINEAR, 2),
        ("bicubic", V.InterpolationMode.BICUBIC, 3),
    ]
    modes += [("lanczos", V.InterpolationMode.LANCZOS, 1)]
    for name, (h, w, c), (oh, ow), crop in RESAMPLE_CASES:
        arr = np.array(_photo(h, w, h * w))
        arr = np.ascontiguousarray(arr[..., :1]) if c == 1 else arr
        top, left, ch, cw = crop if crop is not None else (0, 0, h, w)
        pil = Image.fromarray(arr[..., 0] if c == 1 else arr)
        for mode_name, mode, flt in modes:
            out = np.empty((oh, ow, c), np.uint8)
            native.resample(arr[top : top + ch, left : left + cw], out, (0.0, 0.0, cw, ch), flt)
            ref = np.asarray(F.resized_crop(pil, top, left, ch, cw, [oh, ow], mode))
            ref = ref.reshape(oh, ow, c).astype(np.int16)
            d_pil = int(np.abs(out.astype(np.int16) - ref).max())
            worst = max(worst, d_pil / 255.0)
            tensor_note = ""
            if mode_name != "lanczos":  # torch has no antialiased lanczos for tensors
                t = torch.from_numpy(arr).permute(2, 0, 1).contiguous()  # as decode_image gives
                r = F.resized_crop(t, top, left, ch, cw, [oh, ow], mode, antialias=True)
                d_t = int(np.abs(out.astype(np.int16) - r.permute(1, 2, 0).numpy()).max())
                tensor_note = f", tensor {d_t}/255"
            flag = "ok" if d_pil <= 1 else "FAIL"
            print(f"  {name:<36} {mode_name:<9} max diff: PIL {d_pil}/255{tensor_note}  {flag}")
    return worst


def as_unit_array(x: Any) -> np.ndarray:
    """An output (PIL image, array or tensor) as float64 C x H x W."""
    if hasattr(x, "numpy"):
        return np.asarray(x.numpy(), dtype=np.float64)
    if isinstance(x, np.ndarray) and x.dtype != np.uint8:
        return x.astype(np.float64)
    arr = np.asarray(x, dtype=np.float64) / 255.0
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def main() -> int:
    """Run every case; print a table; return 1 if any difference exceeds 1/255."""
    try:
        import torchvision
        from torchvision import datasets
        from torchvision import transforms as V
    except ImportError:
        print("torchvision is not installed here: nothing to compare.")
        return 0
    import stoker.vision as SV
    from stoker.vision import transforms as S

    img = _photo(150, 200, 0)
    worst = 0.0
    print(f"stoker vs torchvision {torchvision.__version__}, tolerance {TOLERANCE:.5f}")
    for name, s, v in cases(S, V):
        a, b = as_unit_array(s(img)), as_unit_array(v(img))
        if "Normalize" in name:  # back to [0, 1] units
            a, b = a * np.array(STD)[:, None, None], b * np.array(STD)[:, None, None]
        diff = float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
        worst = max(worst, diff)
        flag = "ok" if diff <= TOLERANCE else "FAIL"
        print(f"  {name:<48} shape {tuple(a.shape)!s:<16} max diff {diff:.6f}  {flag}")
    with tempfile.TemporaryDirectory() as tmp:
        for c in range(2):
            (Path(tmp) / f"c{c}").mkdir()
            for i in range(3):
                _photo(375, 500, 10 * c + i).save(Path(tmp) / f"c{c}" / f"{i}.jpg", quality=90)
        for label, sizes in (
            ("fast path Resize(256)+CenterCrop(224)", (256, 224)),
            ("fast path Resize(64)+CenterCrop(56) (DCT 1/4)", (64, 56)),
        ):
            st = S.Compose(
                [S.Resize(sizes[0]), S.CenterCrop(sizes[1]), S.ToTensor(), S.Normalize(MEAN, STD)]
            )
            vt = V.Compose(
                [V.Resize(sizes[0]), V.CenterCrop(sizes[1]), V.ToTensor(), V.Normalize(MEAN, STD)]
            )
            sd, vd = SV.ImageFolder(tmp, transform=st), datasets.ImageFolder(tmp, transform=vt)
            assert sd._fast_plan() is not None
            diffs = [
                np.abs(np.asarray(sd[i][0], np.float64) - vd[i][0].numpy().astype(np.float64))
                * np.array(STD)[:, None, None]
                for i in range(len(sd))
            ]
            mx = max(float(d.max()) for d in diffs)
            mean = float(np.mean([d.mean() for d in diffs]))
            dct = "DCT" in label
            flag = "ok" if (mx <= TOLERANCE or dct) else "FAIL"
            if not dct:
                worst = max(worst, mx)
            print(
                f"  {label:<48} max diff {mx:.6f} mean {mean:.6f}  {flag}"
                + ("  (reduced-scale decode: documented, not held to 1/255)" if dct else "")
            )
    import torch
    from torchvision.transforms import functional as F

    worst = max(worst, check_resampler(V, F, torch))
    print(f"worst difference {worst:.6f} ({worst * 255:.2f}/255)")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
