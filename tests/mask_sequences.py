"""One driver for the property tests that run a batched env (``EnvPool``, ``WorldModelEnv``) through a drawn
sequence of ``"_reset"`` masks, full resets, ``"_step"`` masks, ``step`` and ``step_and_maybe_reset``, checking every
output against a per-row reference loop.

A reference has ``n`` rows and ``reset(i)``, ``step(i, action)``, ``freeze(i)`` (a row left out of ``"_step"``:
it keeps everything and reports reward 0), ``done(i)`` and ``assert_matches(td, where, with_reward=True)``.
"""

import numpy as np
import torch


def drive_against_reference(env, ref, plan, as_action=torch.tensor):
    """Run ``plan``, entries ``(reset, step mask, how, actions)``: a reset is None (none), "full" (``reset()`` with
    no mask) or a ``"_reset"`` mask; a step mask None (no ``"_step"``) or a mask; ``how`` "step" or "smr"
    (``step_and_maybe_reset``); ``as_action`` makes the action tensor of a row list."""
    n = ref.n
    td = env.reset()
    for i in range(n):
        ref.reset(i)
    ref.assert_matches(td, "first reset", with_reward=False)
    for t, (reset, step_rows, how, actions) in enumerate(plan):
        stepped = [True] * n if step_rows is None else step_rows
        if reset == "full":
            td = env.reset()
            reset = [True] * n
        elif reset is not None or any(ref.done(i) and stepped[i] for i in range(n)):
            # a row that ended must be reset before it steps again (the env refuses otherwise)
            reset = [bool(r) or (ref.done(i) and stepped[i]) for i, r in enumerate(reset or [False] * n)]
            td["_reset"] = torch.tensor(reset).unsqueeze(-1)
            td = env.reset(td)
        if reset is not None:
            for i in np.flatnonzero(reset):
                ref.reset(int(i))
            ref.assert_matches(td, f"reset at {t}", with_reward=False)
        td["action"] = as_action(actions)
        if step_rows is not None:
            td["_step"] = torch.tensor(step_rows).unsqueeze(-1)
        else:
            td.pop("_step", None)  # TorchRL carries the last mask into the next root
        if how == "step":
            out = env.step(td)
        else:
            out, root = env.step_and_maybe_reset(td)
        for i in range(n):
            ref.step(i, actions[i]) if stepped[i] else ref.freeze(i)
        ref.assert_matches(out["next"], f"{how} at {t} (step mask {step_rows})")
        if how == "step":
            td = out["next"].exclude("reward")
        else:
            for i in range(n):
                if ref.done(i):
                    ref.reset(i)
            ref.assert_matches(root, f"smr root at {t}", with_reward=False)
            td = root
