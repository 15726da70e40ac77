"""The script's own last words in a launch's log: what the one-line reason quotes."""

from __future__ import annotations

from torchchaos.harness.errorlines import causes, error_lines

FAILED = ("E1127 04:32:14.381000 23435 site-packages/torch/distributed/elastic/"
          "multiprocessing/api.py:1002] failed (exitcode: {code}) local_rank: 1 (pid: 23441)"
          " of binary: /usr/bin/python3.11")
SENDING = ("W1127 04:32:14.314000 23435 site-packages/torch/distributed/elastic/"
           "multiprocessing/api.py:1028] Sending process 23440 closing signal SIGTERM")
BANNER = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
          "============================================================",
          "/tmp/train.py FAILED", "------------------------------------------------------------"]


def test_argparse_refusing_the_command_line_is_the_error():
    log = ["usage: train.py [-h] [--steps STEPS]",
           "train.py: error: unrecognized arguments: --ckpt_dir x",
           SENDING, FAILED.format(code=2), *BANNER]
    assert causes(log) == ["train.py: error: unrecognized arguments: --ckpt_dir x"]


def test_a_system_exit_message_is_the_last_word_before_the_launcher_speaks():
    log = ["[rank1]: loading shards", "[rank1]: no training data in /data: mount it first",
           SENDING, FAILED.format(code=1), *BANNER]
    assert causes(log) == ["no training data in /data: mount it first"]


def test_a_signal_death_has_no_last_word_and_a_traceback_keeps_its_exception():
    killed = ["step 10 loss 4.1", FAILED.format(code=-9), *BANNER]
    assert error_lines(killed) == []
    raised = ["Traceback (most recent call last):", '  File "t.py", line 3, in <module>',
              "    main()", "ValueError: bad shape (3, 4)", FAILED.format(code=1), *BANNER]
    assert causes(raised) == ["ValueError: bad shape (3, 4)"]


def test_a_peer_s_lost_connection_is_an_echo_and_the_cause_comes_first():
    log = ["[rank0]: RuntimeError: [pair.cc:537] Read error: Connection reset by peer.",
           "[rank1]: KeyError: 'optim'", FAILED.format(code=1)]
    assert causes(log) == ["KeyError: 'optim'"]


def test_read_while_the_ranks_just_exited_the_last_line_counts():
    log = ["usage: x", "[rank0]: config missing: lr"]
    assert error_lines(log) == []
    assert error_lines(log, open_end=True) == ["config missing: lr"]
