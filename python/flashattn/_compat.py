"""flash-attn's other argument names (FA3's hopper interface, FA2's return_attn_probs) for the interface functions:
hints are accepted and ignored, arguments that would change the result and that flashattn does not offer are refused
before any call, naming the argument (docs/python.md, "What flashattn does not offer")."""
from . import _capi

# hints: they choose how, never what, is computed
HINTS = ("num_splits", "pack_gqa", "scheduler_metadata", "sm_margin")

# name -> why it is refused when given (anything but None, 0 or False)
NOT_OFFERED = {
    "dropout_p": "flashattn has no dropout (FA3 dropped it too)",
    "alibi_slopes": "flashattn has no ALiBi (FA3 dropped it too)",
    "qv": "flashattn has no qv (FA3's extra query for MLA's absorbed key/value)",
    "rotary_seqlens": "rotary_seqlens is not offered yet",
}


def refuse(fn, name, value):
    """UnsupportedError for an argument flashattn does not offer, when it is set."""
    if value is None or value is False or (not hasattr(value, "shape") and value == 0):
        return
    raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: {fn}: {name}: {NOT_OFFERED[name]}")


def extra(fn, kwargs, accepted=HINTS, renames=None):
    """Check the keyword arguments a function takes beyond its own: hints (accepted, ignored), renames (FA3's name ->
    ours, e.g. page_table -> block_table: returned as {ours: value}), return_attn_probs, the refused names; anything
    else is a TypeError as Python raises for an unknown keyword. Returns (renamed, return_attn_probs)."""
    renamed, probs = {}, False
    for name, value in kwargs.items():
        if renames and name in renames:
            renamed[renames[name]] = value
        elif name == "return_attn_probs":
            probs = bool(value)
        elif name in NOT_OFFERED:
            refuse(fn, name, value)
        elif name not in accepted:
            raise TypeError(f"{fn}() got an unexpected keyword argument '{name}'")
    return renamed, probs
