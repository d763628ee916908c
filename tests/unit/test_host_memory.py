"""hvdtrain.torch.host_memory: large zeroed CPU buffers on huge pages (the flat gradient and
gathered-parameter buffers of the sharded optimizer)."""

import gc

import pytest

torch = pytest.importorskip("torch")

from hvdtrain.torch.host_memory import HUGE_PAGE, huge_page_zeros  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_a_large_buffer_is_zeroed_writable_and_starts_on_a_huge_page(dtype):
    numel = 3 * HUGE_PAGE // torch.empty((), dtype=dtype).element_size() + 5  # not a whole number of pages
    buffer = huge_page_zeros(numel, dtype)
    assert buffer.shape == (numel,) and buffer.dtype == dtype and buffer.is_contiguous()
    assert buffer.data_ptr() % HUGE_PAGE == 0
    assert not buffer.any()
    buffer[-1] = 7
    buffer[0] = 3
    assert int(buffer.sum()) == 10
    assert not huge_page_zeros(numel, dtype).any()  # a second one is a new mapping, zeroed


def test_small_buffers_and_views_behave_like_torch_zeros():
    small = huge_page_zeros(10, torch.float32)
    assert small.shape == (10,) and not small.any()
    big = huge_page_zeros(HUGE_PAGE, torch.float32)
    halves = torch.split(big, HUGE_PAGE // 2)
    halves[1].add_(1.0)
    assert float(big.sum()) == HUGE_PAGE // 2


def test_the_mapping_lives_as_long_as_a_view_of_it():
    big = huge_page_zeros(HUGE_PAGE, torch.float32)
    big[10:20] = 1.0
    view = big[10:20]
    del big
    gc.collect()
    view.add_(2.0)  # still mapped: a freed mapping would crash here or read other memory
    assert view.tolist() == [3.0] * 10


def test_a_kernel_without_huge_pages_gets_ordinary_pages(monkeypatch):
    import mmap

    monkeypatch.setattr(mmap, "MADV_HUGEPAGE", 12345)  # advice the kernel refuses (EINVAL), as one without THP does
    buffer = huge_page_zeros(HUGE_PAGE, torch.float32)
    assert buffer.shape == (HUGE_PAGE,) and not buffer.any()
    buffer += 1.0
    assert float(buffer.sum()) == HUGE_PAGE
