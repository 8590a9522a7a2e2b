"""A copy for ``processes_at_once``'s tests: copy 1 fails at once, copy 0 waits for it at a
meeting (it would wait ``MEET_TIMEOUT_S`` if nothing ended it)."""

from shardbench.prediction.processes_at_once import Together, answer, read_request

if __name__ == "__main__":
    request = read_request()
    together = Together(request)
    if request["copy"] == 1:
        raise SystemExit("copy 1 fails on purpose")
    together()
    answer({"copy": request["copy"]})
