"""How far apart the queue-note writer spaces its batches (services/trainer/queuenotes.py)."""

from __future__ import annotations

from trainforge_services.trainer import queuenotes
from trainforge_services.trainer.queuenotes import gap


def test_a_small_quick_batch_waits_the_interval():
    assert gap(3, 0.002) == queuenotes.INTERVAL


def test_a_long_queue_spaces_batches_by_its_size():
    assert gap(10_000, 0.5) == 10_000 * queuenotes.PER_NOTE


def test_a_slow_store_spaces_batches_by_what_the_last_one_took():
    # 900 notes that took 3 s to store (the loaded embedded store): the store writes notes at most 1/(1+SHARE)
    # of the time
    took = 3.0
    wait = gap(900, took)
    assert wait == queuenotes.SHARE * took
    assert took / (took + wait) <= 1 / (1 + queuenotes.SHARE)
