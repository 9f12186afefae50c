import torch

from tasks.methods.masking import mask_tokens

MASK, VOCAB = 103, 1000


def random_batch(B=256, L=64):
    ids = torch.randint(200, VOCAB, (B, L))  # ids >= 200 so a masked/kept id is never mistaken for MASK
    lengths = torch.randint(2, L + 1, (B,))
    real = torch.arange(L)[None] < lengths[:, None]
    maskable = real.clone()
    maskable[:, 0] = False  # [CLS]
    maskable[torch.arange(B), lengths - 1] = False  # [SEP]
    return ids, maskable


def test_token_masking_ratio_and_80_10_10():
    torch.manual_seed(0)
    ids, maskable = random_batch()
    masked, labels = mask_tokens(ids, maskable, 0.15, MASK, VOCAB)
    selected = labels != -100
    assert not (selected & ~maskable).any()
    assert (masked[~selected] == ids[~selected]).all()  # unselected positions are untouched
    assert (labels[selected] == ids[selected]).all()
    n = selected.sum().item()
    assert abs(n / maskable.sum().item() - 0.15) < 0.01
    to_mask = (masked[selected] == MASK).float().mean().item()
    unchanged = (masked[selected] == ids[selected]).float().mean().item()
    random = 1 - to_mask - unchanged  # a random id equal to the original counts as unchanged (p=1e-3)
    assert abs(to_mask - 0.8) < 0.02 and abs(unchanged - 0.1) < 0.02 and abs(random - 0.1) < 0.02
    assert ((masked >= 0) & (masked < VOCAB)).all()


def test_every_row_with_a_maskable_token_gets_one():
    torch.manual_seed(0)
    ids = torch.randint(200, VOCAB, (500, 3))
    maskable = torch.tensor([False, True, False]).expand(500, 3).clone()
    maskable[:10] = False  # rows with nothing to mask stay untouched
    masked, labels = mask_tokens(ids, maskable, 0.15, MASK, VOCAB)
    assert ((labels != -100).sum(1)[10:] == 1).all()
    assert (labels[:10] == -100).all() and (masked[:10] == ids[:10]).all()


def test_whole_word_masking_selects_whole_words_at_ratio():
    torch.manual_seed(0)
    B, W = 200, 30
    # Words of 1-3 tokens between [CLS] (-1) and [SEP] (-1), then padding (-1).
    word_ids = torch.full((B, 2 * W * 3), -1)
    for b in range(B):
        sizes = torch.randint(1, 4, (W,))
        word_ids[b, 1 : 1 + sizes.sum()] = torch.repeat_interleave(torch.arange(W), sizes)
    ids = torch.randint(200, VOCAB, word_ids.shape)
    maskable = word_ids >= 0
    _, labels = mask_tokens(ids, maskable, 0.3, MASK, VOCAB, word_ids)
    selected = labels != -100
    assert not (selected & ~maskable).any()
    # Per (row, word): how many of its tokens were selected, out of how many it has.
    slot = (torch.arange(B)[:, None] * W + word_ids).clamp(min=0)[maskable]
    hits = torch.zeros(B * W).index_add_(0, slot, selected[maskable].float())
    sizes = torch.zeros(B * W).index_add_(0, slot, torch.ones(len(slot)))
    assert ((hits == 0) | (hits == sizes)).all()  # all of a word's tokens or none
    chosen = (hits > 0).sum().item()
    assert abs(chosen / (B * W) - 0.3) < 0.02


def test_masking_uses_the_global_rng():
    ids, maskable = random_batch(8, 16)
    torch.manual_seed(1)
    first = mask_tokens(ids, maskable, 0.15, MASK, VOCAB)
    torch.manual_seed(1)
    second = mask_tokens(ids, maskable, 0.15, MASK, VOCAB)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
