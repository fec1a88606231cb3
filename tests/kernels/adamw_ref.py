# Reference for tests/kernels/test_optimizer.cpp: runs PyTorch's AdamW and SGD (torch 1.13, CPU,
# float32) on inputs written by the test, and prints the final state.
# Input file: line 1 "n steps lr beta1 beta2 eps wd momentum dampening sgd_wd nesterov",
# line 2 the n parameters, then `steps` lines of n gradients.
# Output: five lines of n values: adamw param, exp_avg, exp_avg_sq, sgd param, momentum buffer.
import sys

import torch


def main():
    rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
    n, steps = int(rows[0][0]), int(rows[0][1])
    lr, b1, b2, eps, wd, mom, damp, sgd_wd = map(float, rows[0][2:10])
    nesterov = rows[0][10] == "1"
    p0 = torch.tensor([float(x) for x in rows[1]], dtype=torch.float32)
    grads = [torch.tensor([float(x) for x in rows[2 + s]], dtype=torch.float32)
             for s in range(steps)]
    assert p0.numel() == n

    pa = p0.clone().requires_grad_(True)
    adamw = torch.optim.AdamW([pa], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    ps = p0.clone().requires_grad_(True)
    sgd = torch.optim.SGD([ps], lr=lr, momentum=mom, dampening=damp, weight_decay=sgd_wd,
                          nesterov=nesterov)
    for g in grads:
        pa.grad = g.clone()
        adamw.step()
        ps.grad = g.clone()
        sgd.step()
    st = adamw.state[pa]
    out = [pa.detach(), st["exp_avg"], st["exp_avg_sq"], ps.detach(),
           sgd.state[ps]["momentum_buffer"]]
    for t in out:
        print(" ".join("%.9g" % v for v in t.tolist()))


if __name__ == "__main__":
    main()
