"""The Trainer: the one owner of the job record.

Every state a user sees comes from here, so admission, team quotas, the
queue, the state machine and usage accounting live together behind one gRPC
service (protos/trainer.proto); other processes report what they observe
and the Trainer decides what it means for the job.

Layers, top to bottom (import-linter keeps them): wiring (builds the
parts) -> grpc_api (protos <-> records) -> job_service (use cases) ->
dispatcher
(admission passes, capacity cache) -> lcmcalls (the rules' actions: the
pool of LCM calls) -> rules (what each transition means: restart or fail,
halt, clean up, requeue) -> store (the only code that sees MongoDB
documents) -> record (the typed `JobRecord`) beside admission (the
admission policy) -> resources (the shared vocabulary: usage, quotas,
queue entries, the backend's size; plain values). The wiring builds the LCM
calls and the rules' lifecycle once and hands both to the dispatcher and
the service.
"""
