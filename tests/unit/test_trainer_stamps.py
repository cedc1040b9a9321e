"""The stamps of this process's job writes not acknowledged yet (services/trainer/stamps.py)."""

import threading

from trainforge_services.trainer.stamps import Stamps


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_settled_is_the_oldest_stamp_still_out_or_now():
    clock = Clock()
    stamps = Stamps(clock)
    assert stamps.settled() == 100.0
    with stamps.taken() as first:
        clock.now = 101.0
        with stamps.taken() as second, stamps.taken() as same:  # two writes may share a stamp
            assert (first, second, same) == (100.0, 101.0, 101.0)
            clock.now = 105.0
            assert stamps.settled() == 100.0
        assert stamps.settled() == 100.0
    assert stamps.settled() == 105.0


def test_a_failed_write_gives_its_stamp_back():
    clock = Clock()
    stamps = Stamps(clock)
    try:
        with stamps.taken():
            clock.now = 102.0
            raise ConnectionError("store gone")
    except ConnectionError:
        pass
    assert stamps.settled() == 102.0


def test_concurrent_writers():
    stamps = Stamps()
    go = threading.Barrier(8)

    def write() -> None:
        go.wait(timeout=10)
        for _ in range(200):
            with stamps.taken() as stamp:
                assert stamps.settled() <= stamp

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not stamps._out  # every stamp given back
