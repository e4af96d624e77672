"""An in-process stand-in for elastic_ps.client.PsClient (same methods and semantics that
the torch modules rely on: lazy row creation with a deterministic initializer, read-only
pulls, duplicate ids summed on push, server-side SGD / Adagrad) for tests that need no
cluster. It records every push so tests can inspect what was sent."""

import numpy as np

_DEFAULTS = {"sgd": 0.01, "adagrad": 0.01}


class FakePsClient:
    def __init__(self):
        self.tables = {}  # name -> dict(dim, opt, lr, init, rows, acc)
        self.dense = {}  # name -> dict(shape, opt, lr, value, acc)
        self.pushes = []  # (table, ids, grads, learning_rate)
        self.dense_pushes = []
        self.pulls = []  # (table, ids, read_only)

    # ---- catalog ----
    def create_table(self, name, dim, optimizer="adagrad", learning_rate=None,
                     initializer="normal", initial_accumulator=0.1, epsilon=1e-10, **init):
        spec = dict(dim=int(dim), opt=optimizer, lr=learning_rate or _DEFAULTS[optimizer],
                    init=(initializer, init), acc0=initial_accumulator, eps=epsilon)
        old = self.tables.get(name)
        if old is not None:
            if any(old[k] != spec[k] for k in spec):
                raise ValueError(f"table {name} exists with another spec")
            return
        spec.update(rows={}, acc={})
        self.tables[name] = spec

    def create_dense(self, name, shape, optimizer="adagrad", learning_rate=None,
                     initializer="normal", initial_accumulator=0.1, epsilon=1e-10, **init):
        if name in self.dense:
            return
        shape = tuple(int(d) for d in shape)
        rng = np.random.default_rng(abs(hash(name)) % (1 << 32))
        value = self._init(rng, initializer, init, int(np.prod(shape))).reshape(shape)
        self.dense[name] = dict(shape=shape, opt=optimizer,
                                lr=learning_rate or _DEFAULTS[optimizer], value=value,
                                acc=np.full(shape, initial_accumulator, np.float32),
                                eps=epsilon)

    @staticmethod
    def _init(rng, kind, p, n):
        if kind == "zeros":
            return np.zeros(n, np.float32)
        if kind == "constant":
            return np.full(n, p.get("value", 0.0), np.float32)
        if kind == "uniform":
            return rng.uniform(p.get("low", -0.01), p.get("high", 0.01), n).astype(np.float32)
        return (p.get("mean", 0.0) + p.get("stddev", 0.01) * rng.standard_normal(n)).astype(
            np.float32)

    def _initial(self, table, t, i):
        rng = np.random.default_rng([abs(hash(table)) % (1 << 32), int(i) & 0xFFFFFFFFFFFF])
        kind, p = t["init"]
        return self._init(rng, kind, p, t["dim"])

    # ---- sparse ----
    def pull(self, table, ids, read_only=False):
        t = self.tables[table]
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.pulls.append((table, ids.copy(), read_only))
        out = np.empty((len(ids), t["dim"]), np.float32)
        for k, i in enumerate(ids.tolist()):
            row = t["rows"].get(i)
            if row is None:
                row = self._initial(table, t, i)
                if not read_only:
                    t["rows"][i] = row
                    t["acc"][i] = np.full(t["dim"], t["acc0"], np.float32)
            out[k] = row
        return out

    def pull_multi(self, requests, read_only=False):
        return {t: self.pull(t, ids, read_only) for t, ids in requests.items()}

    def push(self, table, ids, grads, learning_rate=0.0):
        self.push_multi({table: (ids, grads)}, learning_rate)

    def push_multi(self, requests, learning_rate=0.0):
        for table, (ids, grads) in requests.items():
            t = self.tables[table]
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            g = np.asarray(grads, np.float32).reshape(len(ids), t["dim"])
            self.pushes.append((table, ids.copy(), g.copy(), learning_rate))
            uniq, inv = np.unique(ids, return_inverse=True)
            summed = np.zeros((len(uniq), t["dim"]), np.float32)
            np.add.at(summed, inv, g)
            lr = learning_rate if learning_rate > 0 else t["lr"]
            for i, gi in zip(uniq.tolist(), summed):
                if i not in t["rows"]:
                    self.pull(table, [i])
                t["rows"][i] = self._apply(t, t["rows"][i], t["acc"], i, gi, lr)

    @staticmethod
    def _apply(t, w, accs, key, g, lr):
        if t["opt"] == "sgd":
            return w - lr * g
        accs[key] = accs[key] + g * g
        return w - lr * g / (np.sqrt(accs[key]) + t["eps"])

    # ---- dense ----
    def pull_dense(self, names):
        names = [names] if isinstance(names, str) else names
        return {n: self.dense[n]["value"].copy() for n in names}

    def push_dense(self, grads, learning_rate=0.0):
        for name, g in grads.items():
            d = self.dense[name]
            g = np.asarray(g, np.float32).reshape(d["shape"])
            self.dense_pushes.append((name, g.copy()))
            lr = learning_rate if learning_rate > 0 else d["lr"]
            if d["opt"] == "sgd":
                d["value"] = d["value"] - lr * g
            else:
                d["acc"] = d["acc"] + g * g
                d["value"] = d["value"] - lr * g / (np.sqrt(d["acc"]) + d["eps"])
