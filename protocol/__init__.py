"""The message protocol strategies and the ClientApp share: message types, typed instructions and
replies, and their checked encoding into Flower records (``protocol.codec``).

``protocol.messages`` holds what every method uses (info, train, evaluate, loss); a method with
messages of its own has its own module here (``protocol.fedcorr``, ``protocol.feddyn``).
"""
