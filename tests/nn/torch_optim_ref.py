# Reference for tests/nn/test_optim.cpp: runs torch.optim.AdamW or torch.optim.SGD (torch 1.13,
# CPU, float32) on parameters and per-step gradients written by the test, and prints the final
# parameters as JSON.
#
# Input (JSON file, argv[1]): {"runs": [run, ...]}, each run
#   {"optimizer": "adamw" | "sgd",
#    "params": [{"name": str, "shape": [..], "values": [..], "decay": bool}, ...],
#    "grads": [[values of param 0, values of param 1, ...] per step],
#    "lrs": [lr per step],
#    "adamw": {"beta1", "beta2", "eps", "weight_decay"},
#    "sgd": {"momentum", "dampening", "weight_decay", "nesterov"}}
# Weight decay applies only to params with decay = true (the test sets it for ndim >= 2), as
# two param groups.
# Output (stdout): {"results": [{"params": [[final values], ...]} per run]}
import json
import sys

import torch


def run(cfg):
    params = [torch.tensor(p["values"], dtype=torch.float32).reshape(p["shape"]).requires_grad_(True)
              for p in cfg["params"]]
    decay = [p for p, c in zip(params, cfg["params"]) if c["decay"]]
    no_decay = [p for p, c in zip(params, cfg["params"]) if not c["decay"]]
    lr0 = cfg["lrs"][0]
    if cfg["optimizer"] == "adamw":
        o = cfg["adamw"]
        groups = [{"params": decay, "weight_decay": o["weight_decay"]},
                  {"params": no_decay, "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=lr0, betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    else:
        o = cfg["sgd"]
        groups = [{"params": decay, "weight_decay": o["weight_decay"]},
                  {"params": no_decay, "weight_decay": 0.0}]
        opt = torch.optim.SGD(groups, lr=lr0, momentum=o["momentum"], dampening=o["dampening"],
                              nesterov=o["nesterov"])
    for step, grads in enumerate(cfg["grads"]):
        for g in opt.param_groups:
            g["lr"] = cfg["lrs"][step]
        for p, gv in zip(params, grads):
            p.grad = torch.tensor(gv, dtype=torch.float32).reshape(p.shape)
        opt.step()
    return {"params": [p.detach().reshape(-1).tolist() for p in params]}


def main():
    runs = json.load(open(sys.argv[1]))["runs"]
    print(json.dumps({"results": [run(cfg) for cfg in runs]}))


if __name__ == "__main__":
    main()
