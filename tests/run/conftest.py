"""Fixtures of the tests of training runs as users start them."""
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch


@pytest.fixture
def cli(capfd):
    r"""``pyg-dist ARGS`` as ``tests/run/test_cli.py:run`` runs it, in this
    process: its exit status and what it and its ranks wrote to file
    descriptors 1 and 2; warnings ignored, as ``PYTHONWARNINGS=ignore``
    does there; this
    process' threads and random states as they were."""
    from pyg_dist.cli import main

    def call(*args, check=True):
        capfd.readouterr()
        threads, states = torch.get_num_threads(), (torch.get_rng_state(),
                                                    np.random.get_state(), random.getstate())
        code = 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                main(list(args))
        except SystemExit as e:  # as the interpreter ends with it
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            torch.set_num_threads(threads)
            torch.set_rng_state(states[0])
            np.random.set_state(states[1])
            random.setstate(states[2])
        out, err = capfd.readouterr()
        done = subprocess.CompletedProcess(["pyg-dist", *args], code, out, err)
        if check:
            done.check_returncode()
        return done
    return call
