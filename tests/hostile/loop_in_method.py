# base: stub
"""Every method loops forever: each test times out, the grade goes on."""


def _loop(self, *args, **kwargs):
    while True:
        pass


for _cls in (FreeKVCacheBlockQueue, BlockPool):
    for _name, _value in list(vars(_cls).items()):
        if callable(_value) and not _name.startswith("__"):
            setattr(_cls, _name, _loop)
    _cls.__init__ = _loop
