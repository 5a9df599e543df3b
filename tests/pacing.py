"""How prompt a good client's answers must be while another client attacks, on a machine whose
load the test does not know.

The attack tests check that a misbehaving client does not stall the others. A fixed bound (1 s)
failed on a busy machine with nothing wrong in the server (a good client's answer took 1.24 s
because the test machine ran other work), so the bound is relative: the same good client's
answers are measured just before the attack, on the same server at the same moment, and during
the attack its slowest answer may be at most ``SLOWDOWN`` times the slowest of those (never under
``PROMPT_S``, and scaled by how over-subscribed the machine's cores are). On a quiet machine that
is the 1 s it always was; the attacks these tests guard against held clients for seconds to
minutes, far past either.
"""

from __future__ import annotations

import os

PROMPT_S = 1.0  # the bound on a quiet machine (a good client's answer usually takes ~10 ms)
SLOWDOWN = 20  # how much slower than before the attack a good client's answers may get


def busy() -> float:
    """How many runnable tasks each core has had over the last minute (1.0 at most counts as
    idle): the factor a fixed time bound is stretched by on this machine now."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def prompt_bound(before: float = 0.0) -> float:
    """The slowest answer a good client may see during an attack, given the slowest of its
    answers just before it (``before``, seconds; 0 when not measured)."""
    return max(PROMPT_S * busy(), SLOWDOWN * before)


def patient(seconds: float) -> float:
    """A wait for something that must happen "soon" (a timeout firing, a process exiting),
    stretched on a busy machine; the lower bounds of such checks are not stretched."""
    return seconds * busy()
