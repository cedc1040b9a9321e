"""The test node: a test node that runs each bound pod's containers as local processes with the pod's env and
reports pod status through the real API.

There is no kubelet or kube-scheduler in the control-plane tier (tests/kube.py); this process stands in for
both on one Node: it schedules pods that fit (node.py, fit.py), runs their containers' command+args as local
processes with the resolved env, volumes as directories and the pod IP 127.0.0.1 (containers.py, pod.py), and
writes the pod status the kubelet would. Every pod shares the node's loopback, so two pods must not listen on
the same port. The `kube_node` fixture (tests/kube.py) starts it as a separate process
(`python -m tests.kubenode`). docs/KUBERNETES_TESTING.md lists what it does and does not do.
"""
