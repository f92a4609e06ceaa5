"""The fleet's Python side of the Redis protocol (the Lua and PROTOCOL.md live in queue/).

    protocol.py   keys, scripts, connection, errors, figures and the chunk job's codec (both sides)
    owner.py      the worker holding a client's connection: admit, read results in order, release
    replica.py    the worker running the model: lease, run, heartbeat, complete, reap
    service.py    FleetSpeechService: the speech-service contract over the shared queue
"""
