# The PyTorch oracle for the optimizer and LR scheduler tests: runs torch.optim on data it makes, writes raw results.
# Usage: optim_oracle.py optimizer|scheduler|warning '<json config>' <output dir>
import json
import os
import sys
import warnings

import torch


def write(out, name, t, dtype=torch.float32):
    t.detach().to(dtype).contiguous().numpy().tofile(os.path.join(out, name + '.bin'))


DTYPES = {'float16': torch.float16, 'bfloat16': torch.bfloat16}


def values(shape, cfg):
    t = torch.randn(shape)  # made representable in values_dtype when given
    return t.to(DTYPES[cfg['values_dtype']]).float() if cfg.get('values_dtype') else t


def run_optimizer(cfg, out):
    torch.manual_seed(cfg['seed'])
    params = [values(s, cfg).requires_grad_() for s in cfg['shapes']]
    for j, p in enumerate(params):
        write(out, f'init_{j}', p)
    grads = [[values(s, cfg) for s in cfg['shapes']] for _ in range(cfg['steps'])]
    for k, step_grads in enumerate(grads):
        for j, g in enumerate(step_grads):
            write(out, f'grad_{k}_{j}', g)
    groups = [{'params': [params[j] for j in g['params']], 'lr': g['lr'], 'weight_decay': g['weight_decay']}
              for g in cfg['groups']]
    o = cfg['options']
    if cfg['kind'] == 'sgd':
        opt = torch.optim.SGD(groups, lr=groups[0]['lr'], momentum=o['momentum'], dampening=o['dampening'],
                              nesterov=o['nesterov'], foreach=False)
    else:
        cls = torch.optim.AdamW if cfg['kind'] == 'adamw' else torch.optim.Adam
        opt = cls(groups, betas=(o['beta1'], o['beta2']), eps=o['eps'], amsgrad=o['amsgrad'], foreach=False)
    round_to = DTYPES.get(cfg.get('round_to'))
    for k in range(cfg['steps']):
        for p, g in zip(params, grads[k]):
            p.grad = g.clone()
        opt.step()
        for j, p in enumerate(params):
            if round_to is not None:  # a 16-bit parameter updated in float32 and rounded back each step
                with torch.no_grad():
                    p.copy_(p.to(round_to).float())
            write(out, f'weight_{k}_{j}', p)
    for j, p in enumerate(params):
        names = [n for n, v in opt.state[p].items() if v is not None]
        with open(os.path.join(out, f'state_{j}.txt'), 'w') as f:
            f.write(''.join(n + '\n' for n in names))
        for n in names:
            write(out, f'state_{j}_{n}', opt.state[p][n])


def make_scheduler(cfg, opt):
    s = torch.optim.lr_scheduler
    a = cfg['args']
    if cfg['kind'] == 'step':
        return s.StepLR(opt, step_size=a['step_size'], gamma=a['gamma'])
    if cfg['kind'] == 'cosine':
        return s.CosineAnnealingLR(opt, T_max=a['t_max'], eta_min=a['eta_min'])
    if cfg['kind'] == 'onecycle':
        return s.OneCycleLR(opt, max_lr=a['max_lr'], total_steps=a['total_steps'], pct_start=a['pct_start'],
                            anneal_strategy=a['anneal'], div_factor=a['div_factor'],
                            final_div_factor=a['final_div_factor'], three_phase=a['three_phase'],
                            cycle_momentum=False)
    if cfg['kind'] == 'warmup':
        return s.LinearLR(opt, start_factor=a['start_factor'], end_factor=1.0, total_iters=a['warmup_steps'])
    raise ValueError(cfg['kind'])


def make_sgd(cfg):
    return torch.optim.SGD([{'params': [torch.zeros(1, requires_grad=True)], 'lr': lr} for lr in cfg['lrs']],
                           lr=cfg['lrs'][0])


def run_scheduler(cfg, out):
    opt = make_sgd(cfg)
    sched = make_scheduler(cfg, opt)
    lrs = [sched.get_last_lr()]
    for _ in range(cfg['steps']):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr())
    write(out, 'lrs', torch.tensor(lrs, dtype=torch.float64), torch.float64)


def run_warning(cfg, out):
    opt = make_sgd(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        sched = make_scheduler(cfg, opt)
        sched.step()
        opt.step()
    with open(os.path.join(out, 'warning.txt'), 'w') as f:
        f.write(''.join(str(w.message) + '\n' for w in caught))


if __name__ == '__main__':
    mode, config, out_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    os.makedirs(out_dir, exist_ok=True)
    {'optimizer': run_optimizer, 'scheduler': run_scheduler, 'warning': run_warning}[mode](config, out_dir)
