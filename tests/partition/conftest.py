import subprocess

import pytest


@pytest.fixture
def small_disk(tmp_path):
    r"""``small_disk(size)``: a real filesystem of :obj:`size` (a tmpfs
    mounted in :obj:`tmp_path`, unmounted afterwards); skips where mounting
    is not allowed (it needs root)."""
    mounted = []

    def mount(size: str):
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], capture_output=True)
