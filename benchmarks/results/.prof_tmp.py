import cProfile, pstats, time, torch
from rollbuf import functional as F
N, T = 4096, 128
g = torch.Generator(device="cuda").manual_seed(0)
r = torch.randn(N, T, device="cuda"); v = torch.randn(N, T, device="cuda")
k = torch.rand(N, T, device="cuda") < 0.01; b = torch.randn(N, device="cuda")
call = lambda: F.advantages(0.99, 0.95, rewards=r, values=v, terminated=k, bootstrap_values=b)
for _ in range(50): call()
torch.cuda.synchronize()
for rep in range(3):
    t = time.perf_counter()
    for _ in range(2000): call()
    torch.cuda.synchronize(); print("us per call", (time.perf_counter() - t) / 2000 * 1e6)
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): call()
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
pstats.Stats(pr).sort_stats("cumtime").print_stats(30)
