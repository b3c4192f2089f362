"""Translate a torchvision Compose into the ``TvPlan`` that DALI runs: exactly, or not at all.

``from_torchvision`` follows the Compose with ``flow.walk`` (dtype, tensor kind, the affine map
of the values, the size) and builds the plan from what torchvision does on the decoded uint8
image. What DALI cannot reproduce is refused with ``UnsupportedTransformError``, naming the
step, its position, the parameter and the reason; what torchvision itself refuses raises
``InvalidTransformError`` first.

How values are reproduced: DALI augments uint8 images as torchvision does until the first
float conversion; ``ToDtype`` / ``ConvertImageDtype`` / ``Normalize`` steps compose into one
per-channel map ``scale * x + shift``, applied where the next geometric step needs float
input (an ``affine`` op) or fused into the output op. A Compose with no float conversion
gives the uint8 values as floats (0.0..255.0) in every backend.

Tolerances (checked by tests/test_translation_table.py and tests/test_migrate.py):

* Resampling: BILINEAR, BICUBIC and LANCZOS with ``antialias=True`` differ from torch by at
  most 1/255 on average on worst-case noise (single pixels up to 34/255); BILINEAR with
  ``antialias=False`` and any upscale by at most 1/255 per pixel. NEAREST_EXACT picks the same
  pixels except where a source coordinate falls exactly on a pixel boundary, where float
  rounding can pick the neighbouring row.
* Warps (RandomRotation, RandomAffine, the AutoAugment family's shears, translations and
  rotations): torchvision's border too, the fill blended by the warped mask for BILINEAR
  (``pipelines.dali.geometry.warp``); a pixel may differ by one level where float rounding
  meets torchvision's round half to even.
* Intermediate float16 / bfloat16 / float64 steps are computed in float32 by DALI.
* ColorJitter and RandomGrayscale compute what torchvision's uint8 kernels compute (its grey
  weights, its truncations, hue in HSV), to within a uint8 level; but DALI applies brightness,
  contrast, saturation, hue in this fixed order where torchvision draws an order per image.
* Random parameters follow the same distributions, drawn on the host from each sample's seed
  (``pipelines.transforms.draws`` NOTE [one plan]): a leading RandomResizedCrop's window and the flips
  are torchvision's own numbers for that seed; the other ops' numbers are not.

The supported transforms are the op registry (``pipelines.transforms.migrate.ops``), whose entries are
registered here: one per ``Op`` kind, with the torchvision classes it translates, its
translate function and its DALI builder (``pipelines.dali.geometry`` / ``colour``, imported
when a graph is built). ``SUPPORTED`` is the registry's names plus the steps that are not
ops: ``Normalize``, the format steps (``FORMAT``) and the float conversions (``DTYPE``), which
set the value map. ``DALI_REFUSED`` lists, for each supported transform, the parameter values
that are refused (the README links to it). Any other transform is
refused.
"""
from __future__ import annotations

from typing import cast

from pipelines.transforms.migrate.errors import (
    InvalidTransformError,
    Problem,
    UnsupportedTransformError,
    refusal,
)
from pipelines.transforms.migrate.flow import (
    BRANCH_SAFE,
    State,
    Step,
    Vec,
    antialias,
    check,
    hw,
    interpolation,
    padding_lrtb,
    resized,
)
from pipelines.transforms.migrate.ops import (
    OpDef,
    Translate,
    always,
    dali,
    entry,
    for_transform,
    names,
    register,
)
from pipelines.transforms.migrate.plan import Op, TvPlan

_AFTER_FLOAT = ("after a float conversion", "torchvision clamps float images to [0, 1] and "
                "DALI runs it on uint8 images; move it before ToDtype")
DALI_REFUSED = {
    "RandomResizedCrop, Resize": (
        ("interpolation=NEAREST", "torch's legacy nearest samples pixel floor(i * in / out), "
         "half a pixel from DALI's nearest; use NEAREST_EXACT"),
        ("interpolation=BICUBIC with antialias=False", "torch's plain bicubic (a = -0.75) is "
         "not DALI's cubic (4/255 apart on average); use antialias=True"),
    ),
    "RandomCrop": (
        ("fill=<dict>", "per-type fills are not translated; give a number or 3 numbers"),
        ("fill=<non-integer or outside 0..255> before the float conversion",
         "torchvision truncates or refuses it on uint8 images"),
    ),
    "RandomErasing": (
        ("value='random'", "per-pixel random values are not translated; give a number or 3"),
        ("value=<non-integer or outside 0..255> before the float conversion",
         "torchvision truncates it on uint8 images"),
    ),
    "TrivialAugmentWide": (
        _AFTER_FLOAT,
        ("interpolation=<not NEAREST or BILINEAR>", "its warps are translated for these two"),
        ("fill=<per-channel or per-type values>", "one fill value is translated"),
    ),
    "RandAugment": (
        _AFTER_FLOAT,
        ("interpolation=<not NEAREST or BILINEAR>", "its warps are translated for these two"),
        ("fill=<per-channel or per-type values>", "one fill value is translated"),
        ("(no fixed size before it)", "its translations are a share of the image size: put a "
         "crop or Resize((h, w)) before it"),
    ),
    "RandomApply, RandomChoice": (
        ("after the float conversion", "their branches are translated on uint8 images"),
        ("<a step that changes the size or is not translated>", "a branch may hold flips, "
         "ColorJitter, RandomGrayscale, GaussianBlur, RandomErasing, the AutoAugment family, "
         "RandomRotation and RandomAffine"),
    ),
    "RandomRotation": (
        _AFTER_FLOAT,
        ("interpolation=<not NEAREST or BILINEAR>", "its warps are translated for these two"),
        ("fill=<per-channel or per-type values>", "one fill value is translated"),
        ("expand=True", "the output size would vary per image"),
    ),
    "RandomAffine": (
        _AFTER_FLOAT,
        ("interpolation=<not NEAREST or BILINEAR>", "its warps are translated for these two"),
        ("fill=<per-channel or per-type values>", "one fill value is translated"),
        ("expand=True", "not an argument of RandomAffine"),
    ),
    "AutoAugment": (
        _AFTER_FLOAT,
        ("interpolation=<not NEAREST or BILINEAR>", "its warps are translated for these two"),
        ("fill=<per-channel or per-type values>", "one fill value is translated"),
        ("(no fixed size before it)", "its translations are a share of the image size: put a "
         "crop or Resize((h, w)) before it"),
    ),
    "ColorJitter": (_AFTER_FLOAT,),
    "RandomGrayscale": (_AFTER_FLOAT,),
    "ToDtype, ConvertImageDtype": (
        ("dtype=<an integer dtype>, unless it keeps uint8 as it is",
         "DALI keeps uint8 until the float conversion and cannot round floats back"),
    ),
    "(the sequence)": (
        ("no fixed output size", "the last size-setting step must be a crop, "
         "Resize((h, w)) or a Resize(int) of a fixed-size image, so that images batch"),
    ),
    "(any other transform)": (
        ("any value", "not supported (AugMix, RandomPerspective, Lambda, ...); the torch "
         "backends run it"),
    ),
}

# torchvision interpolation -> the DALI one that matches it (see the module's tolerances)
INTERP = {"bilinear": "linear", "nearest-exact": "nn", "bicubic": "cubic", "lanczos": "lanczos3"}
PAD_MODE = {"constant": "constant", "edge": "edge", "reflect": "reflect_101",
            "symmetric": "reflect_1001"}


def _resample(t) -> tuple[tuple[tuple[str, object], ...], tuple[str, str] | None]:
    mode, aa = interpolation(t).value, antialias(t)
    if mode == "nearest":
        return (), ("interpolation=NEAREST", DALI_REFUSED["RandomResizedCrop, Resize"][0][1])
    if mode == "bicubic" and not aa:
        return (), ("interpolation=BICUBIC, antialias=False",
                    DALI_REFUSED["RandomResizedCrop, Resize"][1][1])
    if mode not in INTERP:
        return (), (f"interpolation={interpolation(t)}", "no DALI interpolation matches it")
    return (("interp", INTERP[mode]), ("antialias", aa and mode != "nearest-exact")), None


def _range(v, center: float = 1.0) -> tuple[float, float] | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return (max(0.0, center - v), center + v) if v else None
    return float(v[0]), float(v[1])


def _fill(t, s: State):
    fill = t.fill if t.fill is not None else 0
    if isinstance(fill, dict):
        return None, ("fill=" + repr(fill), DALI_REFUSED["RandomCrop"][0][1])
    vals = [float(fill)] * 3 if isinstance(fill, (int, float)) else [float(v) for v in fill]
    if len(vals) == 1:
        vals *= 3
    if len(vals) != 3:
        return None, (f"fill={fill!r}", "needs 1 or 3 values for an RGB image")
    if not s.is_float and any(v != int(v) or not 0 <= v <= 255 for v in vals):
        return None, (f"fill={fill!r}", DALI_REFUSED["RandomCrop"][1][1])
    return tuple(vals), None


# -- the registry: one entry per op kind ------------------------------------------------------
# Each translate function gets the step's transform and the image before it (``flow.State``).


def _flip(kind: str):
    def translate(t, s: State):
        return [Op(kind, (("p", float(t.p)),))], None
    return translate


def _color_jitter(t, s: State):
    return [Op("color_jitter", (
        ("brightness", _range(t.brightness)), ("contrast", _range(t.contrast)),
        ("saturation", _range(t.saturation)), ("hue", _range(t.hue, center=0.0))))], None


def _grayscale(t, s: State):
    return [Op("grayscale", (("p", float(t.p)),))], None


def _gaussian_blur(t, s: State):
    kw, kh = hw(t.kernel_size)  # torchvision's kernel_size is (x, y)
    sigma = [float(v) for v in t.sigma] if not isinstance(t.sigma, (int, float)) \
        else [float(t.sigma)] * 2
    return [Op("gaussian_blur", (("kernel", (kh, kw)), ("sigma", (sigma[0], sigma[-1]))))], None


def _random_erasing(t, s: State):
    """NOTE [RandomErasing]: the box is drawn as torchvision draws it, but from 3 attempts
    where torchvision makes 10 (``pipelines.dali.geometry.random_erase``): they differ only
    when 3 draws in a row do not fit inside the image. The fill is given in the value space of
    the image before the step; the op does not commute with a value map, so the translator
    converts DALI's images to that space first (an ``affine`` op) when they differ."""
    value = getattr(t, "value", None)
    if value is None or isinstance(value, str):
        return [], ("value='random'", DALI_REFUSED["RandomErasing"][0][1])
    vals = [float(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    if len(vals) == 1:
        vals *= 3
    if len(vals) != 3:
        return [], (f"value={value!r}", "needs 1 or 3 values for an RGB image")
    if not s.is_float and any(v != int(v) or not 0 <= v <= 255 for v in vals):
        return [], (f"value={value!r}", DALI_REFUSED["RandomErasing"][1][1])
    return [Op("erase", (("p", float(t.p)), ("scale", tuple(float(v) for v in t.scale)),
                         ("ratio", tuple(float(v) for v in t.ratio)),
                         ("value", tuple(vals))))], None


def _auto_common(t, s: State, name: str, sized: bool = False):
    """The checks every warping step shares: ``((interpolation, fill), None)`` or ``(None,
    problem)``; ``sized``: the step's magnitudes scale with a size fixed before it."""
    why = DALI_REFUSED[name]
    if sized and s.size is None:
        return None, ("", why[3][1])
    mode = getattr(t.interpolation, "value", t.interpolation)
    if mode not in ("nearest", "bilinear"):
        return None, (f"interpolation={mode!r}", why[1][1])
    fill = getattr(t, "_fill", {"others": getattr(t, "fill", None)})
    vals: set[float | None] = set()
    for v in (fill.values() if isinstance(fill, dict) else [fill]):
        # None: no fill, zero padding; the same as 0 for nearest, not for bilinear (the fill
        # is blended in by the warped mask only when one is given; geometry.warp)
        vals |= {None if mode == "bilinear" else 0.0} if v is None else \
            {float(u) for u in (v if isinstance(v, (list, tuple)) else [v])}
    one = next(iter(vals)) if len(vals) == 1 else 0.0
    if len(vals) != 1 or (one is not None and not 0 <= one <= 255):
        return None, (f"fill={t.fill!r}", why[2][1])
    if mode == "nearest" and one is not None:
        one = float(round(one))  # torchvision rounds the filled float image half to even
    return (mode, one), None


def _trivial_augment(t, s: State):
    """TrivialAugmentWide (``pipelines.dali.autoaug``, NOTE [what matches torchvision])."""
    got, bad = _auto_common(t, s, "TrivialAugmentWide")
    if bad:
        return [], bad
    return [Op("trivial_augment", (("bins", int(t.num_magnitude_bins)), ("interp", got[0]),
                                   ("fill", got[1]), ("size", None)))], None


def _rand_augment(t, s: State):
    got, bad = _auto_common(t, s, "RandAugment", sized=True)
    if bad:
        return [], bad
    # flow.check refused magnitudes outside -bins..bins-1; torchvision indexes its table with
    # it, so a negative one counts from the end
    assert s.size is not None  # sized: _auto_common refused an unknown size
    bins = int(t.num_magnitude_bins)
    return [Op("rand_augment", (("num_ops", int(t.num_ops)), ("magnitude", int(t.magnitude) % bins),
                                ("bins", int(t.num_magnitude_bins)), ("interp", got[0]),
                                ("fill", got[1]), ("size", tuple(s.size))))], None


def _auto_augment(t, s: State):
    got, bad = _auto_common(t, s, "AutoAugment", sized=True)
    if bad:
        return [], bad
    assert s.size is not None  # sized: _auto_common refused an unknown size
    return [Op("auto_augment", (("policy", t.policy.value), ("interp", got[0]),
                                ("fill", got[1]), ("size", tuple(s.size))))], None


def _affine_family(t, s: State):
    """RandomRotation and RandomAffine (``pipelines.dali.geometry.affine``)."""
    name = type(t).__name__
    got, bad = _auto_common(t, s, name)
    if bad:
        return [], bad
    if getattr(t, "expand", False):
        return [], ("expand=True", DALI_REFUSED[name][3][1])
    rotate = name == "RandomRotation"
    shear = None
    if not rotate and t.shear is not None:
        sh = [float(v) for v in t.shear]
        shear = tuple(sh + [0.0, 0.0]) if len(sh) == 2 else tuple(sh)
    center = tuple(float(v) for v in t.center) if t.center is not None else None
    return [Op("warp", (("rotate", rotate), ("degrees", tuple(float(v) for v in t.degrees)),
                        ("translate", None if rotate or t.translate is None
                         else tuple(float(v) for v in t.translate)),
                        ("scale", None if rotate or t.scale is None
                         else tuple(float(v) for v in t.scale)),
                        ("shear", shear), ("center", center), ("interp", got[0]),
                        ("fill", got[1])))], None


def _branch_ops(t, s: State, inner) -> tuple[list[Op], tuple[str, str] | None]:
    """The plan ops of the steps inside a ``RandomApply`` / ``RandomChoice``."""
    why = DALI_REFUSED["RandomApply, RandomChoice"]
    if s.is_float:
        return [], ("", why[0][1])
    ops: list[Op] = []
    for u in inner:
        name = type(u).__name__
        e = for_transform(name)
        if name not in BRANCH_SAFE or e is None or getattr(u, "expand", False):
            return [], (name, why[1][1])
        more, bad = cast(Translate, e.translate)(u, s)  # an entry with torchvision names has one
        if bad:
            return [], (f"{name}: {bad[0]}", bad[1])
        ops += more
    return ops, None


def _random_apply(t, s: State):
    ops, bad = _branch_ops(t, s, list(t.transforms))
    if bad:
        return [], bad
    return [Op("random_apply", (("p", float(t.p)), ("ops", tuple(ops))))], None


def _random_choice(t, s: State):
    inner = list(t.transforms)
    ops, bad = _branch_ops(t, s, inner)
    if bad:
        return [], bad
    if len(ops) != len(inner):  # one op per branch, so the draw picks a whole step
        return [], ("transforms", "a step that translates to several ops")
    w = [1.0] * len(inner) if t.p is None else [float(v) for v in t.p]
    return [Op("random_choice", (("p", tuple(v / sum(w) for v in w)), ("ops", tuple(ops))))], \
        None


def _center_crop(t, s: State):
    return [Op("center_crop", (("size", hw(t.size)),))], None


def _random_crop(t, s: State):
    fill, bad = _fill(t, s)
    if bad:
        return [], bad
    if t.padding_mode not in PAD_MODE:
        return [], (f"padding_mode={t.padding_mode!r}", "unknown padding mode")
    pad = padding_lrtb(t) if t.padding is not None else None
    return [Op("random_crop", (("size", hw(t.size)), ("padding", pad),
                               ("pad_if_needed", bool(t.pad_if_needed)), ("fill", fill),
                               ("mode", PAD_MODE[t.padding_mode])))], None


def _pad(t, s: State):
    fill, bad = _fill(t, s)
    if bad:
        return [], bad
    if t.padding_mode not in PAD_MODE:
        return [], (f"padding_mode={t.padding_mode!r}", "unknown padding mode")
    return [Op("pad", (("padding", padding_lrtb(t)), ("fill", fill),
                       ("mode", PAD_MODE[t.padding_mode])))], None


def _random_resized_crop(t, s: State):
    interp, bad = _resample(t)
    if bad:
        return [], bad
    scale, ratio = tuple(map(float, t.scale)), tuple(map(float, t.ratio))
    return [Op("random_resized_crop", (("size", hw(t.size)), ("scale", scale), ("ratio", ratio),
                                       *interp))], None


def _resize(t, s: State):
    """``resize`` to a fixed size where one is known, else ``resize_shorter``."""
    interp, bad = _resample(t)
    if bad:
        return [], bad
    size, max_size = t.size, getattr(t, "max_size", None)
    if size is not None and not isinstance(size, int) and len(size) == 2:
        return [Op("resize", (("size", hw(size)), *interp))], None
    if s.size:  # a Resize(int) of a fixed-size image has a fixed size
        return [Op("resize", (("size", resized(s.size, size, max_size)), *interp))], None
    short = None if size is None else hw(size)[0]
    return [Op("resize_shorter", (("size", short), ("max_size", max_size), *interp))], None


def _pad_commutes(op: Op) -> bool:
    """Edge and reflection padding move pixels; constant padding writes the fill, a value of
    the image's current space."""
    return op["mode"] != "constant"


def _crop_commutes(op: Op) -> bool:
    """A crop without padding moves pixels only; padding adds fill values, which must be
    written in the image's current values."""
    return op["padding"] is None and not op["pad_if_needed"]


register(OpDef("random_resized_crop", dali("geometry.random_resized_crop"),
               ("RandomResizedCrop",), _random_resized_crop,
               decode=dali("geometry.decode_random_resized_crop")))
register(OpDef("resize", dali("geometry.resize_fixed"), ("Resize",), _resize))
register(OpDef("resize_shorter", dali("geometry.resize_shorter")))  # from Resize, AugmentSpec
register(OpDef("center_crop", dali("geometry.centre_crop"), ("CenterCrop",), _center_crop))
register(OpDef("random_crop", dali("geometry.random_crop"), ("RandomCrop",), _random_crop,
               commutes=_crop_commutes))
register(OpDef("hflip", dali("geometry.flip"), ("RandomHorizontalFlip",), _flip("hflip"),
               commutes=always, mirror=dali("geometry.mirror")))
register(OpDef("vflip", dali("geometry.flip"), ("RandomVerticalFlip",), _flip("vflip"),
               commutes=always))
register(OpDef("color_jitter", dali("colour.color_jitter"), ("ColorJitter",), _color_jitter,
               uint8_only=True))
register(OpDef("grayscale", dali("colour.grayscale"), ("RandomGrayscale",), _grayscale,
               uint8_only=True))
register(OpDef("gaussian_blur", dali("colour.gaussian_blur"), ("GaussianBlur",),
               _gaussian_blur))
register(OpDef("trivial_augment", dali("autoaug.trivial_augment"), ("TrivialAugmentWide",),
               _trivial_augment, uint8_only=True, conditional=True))
register(OpDef("rand_augment", dali("autoaug.rand_augment"), ("RandAugment",), _rand_augment,
               uint8_only=True, conditional=True))
register(OpDef("auto_augment", dali("autoaug.auto_augment"), ("AutoAugment",), _auto_augment,
               uint8_only=True, conditional=True))
register(OpDef("random_apply", dali("choice.random_apply"), ("RandomApply",), _random_apply,
               conditional=True))
register(OpDef("random_choice", dali("choice.random_choice"), ("RandomChoice",), _random_choice,
               conditional=True))
register(OpDef("warp", dali("geometry.affine"), ("RandomRotation", "RandomAffine"),
               _affine_family, uint8_only=True))
register(OpDef("pad", dali("geometry.pad"), ("Pad",), _pad, commutes=_pad_commutes))
register(OpDef("erase", dali("geometry.random_erase"), ("RandomErasing",), _random_erasing))
register(OpDef("affine", dali("colour.affine")))  # from the float conversions (_Builder)

# the steps that are not ops: the float conversions and the value map, and the format steps
FORMAT = ("ToImage", "ToPureTensor", "PILToTensor", "ToTensor", "Identity")
DTYPE = ("ToDtype", "ConvertImageDtype")


def supported() -> tuple[str, ...]:
    """Every torchvision class name ``from_torchvision`` accepts: the registry's and the steps
    above."""
    return (*names(), "Normalize", *FORMAT, *DTYPE)


SUPPORTED = supported()  # at import; supported() includes entries registered later


def _translate(e: OpDef, st: Step) -> tuple[list[Op], tuple[str, str] | None]:
    """The plan ops for one step that ``e`` translates, or the reason DALI cannot run it."""
    if e.uint8_only and st.before.is_float:
        return [], _AFTER_FLOAT
    ops, bad = cast(Translate, e.translate)(st.t, st.before)  # e translates st (for_transform)
    for op in ops:
        entry(op)  # a registered kind, or ValueError
    return ops, bad


def _dtype_problem(st: Step) -> tuple[str, str] | None:
    a = st.after
    if a.dtype is not None and not a.dtype.is_floating_point and a.dtype != st.before.dtype:
        return f"dtype={a.dtype}", DALI_REFUSED["ToDtype, ConvertImageDtype"][0][1]
    if a.dtype is not None and st.before.affine and not a.affine:
        return f"dtype={a.dtype}", DALI_REFUSED["ToDtype, ConvertImageDtype"][0][1]
    return None


class _Builder:
    """Collects plan ops; tracks the value map DALI's images carry (uint8 ``x`` until the first
    ``affine`` op)."""

    def __init__(self):
        self.ops: list[Op] = []
        self.scale, self.shift, self.is_float = (1.0,) * 3, (0.0,) * 3, False

    def _rel(self, s: State):
        """The map from DALI's current values to ``s``'s values."""
        scale, shift = cast(Vec, s.scale), cast(Vec, s.shift)  # known where the translation gets
        a = tuple(scale[c] / self.scale[c] for c in range(3))
        b = tuple(shift[c] - a[c] * self.shift[c] for c in range(3))
        return a, b

    def add(self, st: Step, ops: list[Op]) -> None:
        s = st.before
        needs_float = s.is_float and not self.is_float
        a, b = self._rel(s)
        moved = any(v != 1.0 for v in a) or any(b)
        commutes = all(entry(o).commutes(o) for o in ops)
        if (needs_float or moved) and not commutes:
            self.ops.append(Op("affine", (("scale", a), ("shift", b))))
            self.scale, self.shift, self.is_float = s.scale, s.shift, True
        self.ops += ops

    def plan(self, s: State) -> TvPlan:
        a, b = self._rel(s)
        mean = tuple(0.0 - b[c] / a[c] for c in range(3))
        std = tuple(1.0 / a[c] for c in range(3))
        return TvPlan(tuple(self.ops), mean, std, s.size)  # type: ignore[arg-type]


def _rgb(s: State) -> State:
    """``s`` with 3-channel scale / shift (a 1-value Normalize broadcasts)."""
    from dataclasses import replace

    if s.scale is None or len(s.scale) == 3:
        return s
    return replace(s, scale=s.scale * 3, shift=cast(Vec, s.shift) * 3)  # set with scale


def from_torchvision(compose) -> TvPlan:
    """Translate ``compose`` into the plan that the DALI backend runs.

    Args:
        compose: any form ``LoaderConfig(transform=...)`` accepts (a v2 or v1 Compose, a single
            transform, an ``nn.Sequential``), or a list of transforms.

    Raises:
        InvalidTransformError: torchvision itself refuses the sequence (every backend).
        UnsupportedTransformError: lists each step DALI cannot reproduce exactly, with its
            position, parameter and reason.
        TypeError: ``compose`` is not a torchvision transform.
    """
    from torchvision.transforms import v2

    from pipelines.transforms.migrate.forms import as_compose

    if isinstance(compose, (list, tuple)):
        compose = v2.Compose(list(compose))
    steps = check(as_compose(compose))
    b = _Builder()
    problems: list[Problem] = []
    ops: list[Op]
    for st in steps:
        bad, ops, e = None, [], for_transform(st.name)
        if e is None and st.name not in supported():
            bad = ("", "not supported")
        elif st.before.dtype is None:
            continue  # after a refused step
        elif st.name in DTYPE:
            bad = _dtype_problem(st)
        elif e is not None:
            ops, bad = _translate(e, st)
        if bad:
            problems.append(Problem(st.pos, st.name, *bad))
        elif ops and not problems:
            b.add(Step(st.pos, st.t, st.name, _rgb(st.before), st.after), ops)
    end = _rgb(steps[-1].after)
    if not problems and end.size is None:
        problems.append(Problem(-1, "", "no fixed output size",
                                DALI_REFUSED["(the sequence)"][0][1]))
    if problems:
        raise refusal(UnsupportedTransformError, "from_torchvision cannot translate", problems,
                      f"Supported: {', '.join(supported())}")
    return b.plan(end)


__all__ = ["from_torchvision", "DALI_REFUSED", "SUPPORTED", "InvalidTransformError",
           "UnsupportedTransformError"]
