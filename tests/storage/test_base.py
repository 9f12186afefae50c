"""storage/base.py: a full or read-only disk is recognised however the library that hit it says so."""

import errno

import pytest

from storage.base import disk_fault


def raised_over(inner: BaseException, outer: BaseException) -> BaseException:
    """`outer` raised while handling `inner`, as torch.save's RuntimeError over its file's OSError."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - the implicit context is what torch's error carries
    except BaseException as e:
        return e


@pytest.mark.parametrize("error, said", [
    (OSError(errno.ENOSPC, "No space left on device", "/store/a.parquet"),
     "No space left on device: /store/a.parquet; free space on that disk"),
    (OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device"),
     "No space left on device; free space"),  # pyarrow
    (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
     "No space left on device; free space"),  # safetensors (Rust)
    (RuntimeError('IO Error: Could not write file "/store/x.duckdb.wal": No space left on device'),
     "No space left on device; free space"),  # DuckDB
    (raised_over(OSError(errno.ENOSPC, "No space left on device"), RuntimeError("unexpected pos 704 vs 598")),
     "No space left on device; free space"),  # torch.save through a Python file
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/store/b"), "Disk quota exceeded: /store/b; free space"),
    (OSError(errno.EROFS, "Read-only file system", "/store"), "Read-only file system: /store; choose a store this "
                                                               "user can write"),
])
def test_a_disk_fault_is_one_line_whoever_raised_it(error, said):
    assert disk_fault(error).startswith(said)


@pytest.mark.parametrize("error", [
    OSError(errno.ECONNREFUSED, "Connection refused"), RuntimeError("CUDA out of memory"), ValueError("no space"),
    raised_over(KeyError("x"), RuntimeError("unexpected pos 704 vs 598")),
])
def test_other_errors_are_not_disk_faults(error):
    assert disk_fault(error) is None
