"""The speech service, apart from HTTP: what turns a request into audio pieces, here or in the fleet.

    contract.py    SpeechBackend, SpeechRequest, SpeechPlan, AudioPiece, ReplicaStats, chunk_piece,
                   and the domain errors Overloaded and KeyShareFull (api/errors.py maps them)
    local.py       SpeechService: plans a request and streams it on this process's replica
    fleet.py       FleetSpeechService: the same contract over the shared Redis queue (a thin adapter)
    fleet_admission.py  FleetAdmission: a request's way into the fleet (reserve, plan, enqueue, refuse, free)
    fleet_figures.py  FleetFigures: the fleet's snapshot from Redis and its /metrics figures
    worker_queue.py  WorkerQueueOwner: a plain object, the one owner of a worker's queue state (and its counters)
    admission_client.py  AdmissionClient: the owner side's Redis calls (admit, read results in order, release)
    dispatcher.py  Dispatcher, DispatcherConfig: the replica side (lease, run, heartbeat, complete, reap)
    redis_link.py  keys, scripts, connection, errors, figures and the chunk job's codec (both sides)
    build.py       build_service: the one builder of the service a worker serves with
    replica_slots.py  which workers hold a replica when KOKORO_REPLICAS is below the workers
"""
