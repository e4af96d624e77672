"""KeyedJagged: the sparse input of a :class:`PsEmbeddingBagCollection`, in the spirit of
TorchRec's ``KeyedJaggedTensor``: for each key (a feature), a batch of bags of int64 ids.

    KeyedJagged(keys, values, lengths)            # TorchRec's layout: values of every key
                                                  # concatenated, lengths key-major (K * B)
    KeyedJagged.from_offsets({key: (ids, offsets)})  # per key, nn.EmbeddingBag's (input, offsets)
    KeyedJagged.from_dense({key: ids (B, N)})     # per key, bags of a fixed size N

``kj[key]`` is ``(ids, offsets)``: ``ids`` 1-D int64, ``offsets`` the B start positions of
the bags (``nn.EmbeddingBag``'s convention), or None for bags of one id each, the common
one-id-per-field case, which needs no reduction. ``kj.weights(key)``: per-id weights or
None. Tensors are used as given (CPU, not copied); the object is immutable and may be
shared between threads.
"""

import torch


class KeyedJagged:
    """See the module docstring."""

    __slots__ = ("_bags",)

    def __init__(self, keys, values, lengths, weights=None):
        keys = list(keys)
        values = _ids(values)
        lengths = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
        if not keys or lengths.numel() % len(keys):
            raise ValueError(f"KeyedJagged: {lengths.numel()} lengths for {len(keys)} keys")
        if int(lengths.sum()) != values.numel() or bool((lengths < 0).any()):
            raise ValueError(f"KeyedJagged: lengths sum to {int(lengths.sum())} for "
                             f"{values.numel()} values (or are negative)")
        if weights is not None and torch.as_tensor(weights).numel() != values.numel():
            raise ValueError("KeyedJagged: one weight per value")
        b = lengths.numel() // len(keys)
        per_key = lengths.view(len(keys), b).sum(1).tolist()
        bags, start = {}, 0
        for k, n, lens in zip(keys, per_key, lengths.view(len(keys), b)):
            offsets = torch.zeros(b, dtype=torch.int64)
            torch.cumsum(lens[:-1], 0, out=offsets[1:])
            w = None if weights is None else torch.as_tensor(weights)[start:start + n]
            bags[k] = (values[start:start + n], offsets, w)
            start += n
        self._bags = _checked(bags)

    @classmethod
    def from_offsets(cls, bags, weights=None):
        """``bags``: {key: (ids 1-D, offsets (B,))} or {key: (ids, None)} for bags of one
        id each; ``weights``: {key: per-id weights} (optional)."""
        weights = weights or {}
        out = cls.__new__(cls)
        out._bags = _checked({k: (_ids(ids), None if off is None else
                                  torch.as_tensor(off, dtype=torch.int64).reshape(-1),
                                  weights.get(k)) for k, (ids, off) in bags.items()})
        return out

    @classmethod
    def from_dense(cls, ids_by_key):
        """``ids_by_key``: {key: ids (B, N)}: B bags of N ids each (N = 1: no offsets)."""
        bags = {}
        for k, ids in ids_by_key.items():
            ids = torch.as_tensor(ids)
            if ids.dim() != 2:
                raise ValueError(f"KeyedJagged.from_dense: '{k}' has shape {tuple(ids.shape)}, "
                                 "expected (bags, ids per bag)")
            n = ids.shape[1]
            offsets = None if n == 1 else torch.arange(0, ids.numel(), n, dtype=torch.int64)
            bags[k] = (ids.reshape(-1), offsets)
        return cls.from_offsets(bags)

    def keys(self):
        return list(self._bags)

    def __getitem__(self, key):
        ids, offsets, _ = self._bags[key]
        return ids, offsets

    def __contains__(self, key):
        return key in self._bags

    def weights(self, key):
        return self._bags[key][2]

    def num_bags(self, key):
        ids, offsets, _ = self._bags[key]
        return ids.numel() if offsets is None else offsets.numel()

    def same_ids(self, other):
        """Whether ``other`` holds the same keys, ids and bags (weights not compared)."""
        if other is self:
            return True
        if not isinstance(other, KeyedJagged) or other.keys() != self.keys():
            return False
        for k, (ids, off, _) in self._bags.items():
            oids, ooff, _ = other._bags[k]
            if not torch.equal(ids, oids) or (off is None) != (ooff is None):
                return False
            if off is not None and not torch.equal(off, ooff):
                return False
        return True

    def __repr__(self):
        return "KeyedJagged(" + ", ".join(f"{k}: {self.num_bags(k)} bags, "
                                          f"{self._bags[k][0].numel()} ids"
                                          for k in self._bags) + ")"


def _ids(values):
    t = torch.as_tensor(values)
    if t.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"KeyedJagged: ids must be integers, got {t.dtype}")
    return t.to(torch.int64).reshape(-1)


def _checked(bags):
    for k, (ids, offsets, w) in bags.items():
        if offsets is not None and offsets.numel() and (
                int(offsets[0]) != 0 or bool((offsets[1:] < offsets[:-1]).any())
                or int(offsets[-1]) > ids.numel()):
            raise ValueError(f"KeyedJagged: offsets of '{k}' must start at 0 and not "
                             f"decrease nor pass {ids.numel()}")
        if w is not None and torch.as_tensor(w).numel() != ids.numel():
            raise ValueError(f"KeyedJagged: '{k}' has {torch.as_tensor(w).numel()} weights "
                             f"for {ids.numel()} ids")
    return bags
