# The torch learner image: the platform (its controller is each learner pod's injected entrypoint) plus torch.
# Build from the repository root, after the platform image:
#   docker build -f deploy/docker/learner.Dockerfile --build-arg PLATFORM=trainforge/platform:0.1.0 \
#       -t trainforge/learner:torch .
# TORCH picks the wheel: torch==2.13.0 from the default index brings CUDA libraries for NVIDIA nodes.
ARG PLATFORM=trainforge/platform:0.1.0
FROM ${PLATFORM}
ARG TORCH=torch==2.13.0
USER 0:0
RUN python3 -m pip install "${TORCH}"
USER 1000:1000
# learners run in the pod's workdir emptyDir; the controller sets the DDP env (MASTER_ADDR, RANK, ...)
WORKDIR /var/lib/trainforge/work
CMD ["python3", "-m", "trainforge_services.lcm.backends.kubernetes.entry", "learner"]
