"""The Trainer: the one owner of the job record.

Every state a user sees comes from here, so admission, team quotas, the
queue, the state machine and usage accounting live together behind one gRPC
service (protos/trainer.proto); other processes report what they observe
and the Trainer decides what it means for the job.
"""
