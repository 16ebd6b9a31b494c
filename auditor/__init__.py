"""The auditor: the only package that reads both parties' records side by side — what party B
received, party A's canary draw and statistics, gradients — with the attacks (edge inference,
membership, label inference), the canary scorers and the one-run bound (docs/audit.md). The
parties keep only the code that writes those records during a run."""
