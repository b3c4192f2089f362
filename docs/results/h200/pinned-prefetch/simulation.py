# DataLoader in-order delivery, simulated: n=14 workers, each batch N(mean 1.0, sd) time units, depth k tasks a worker
# (prefetch_factor), a consumer of 0.054 a step (loader-bound: 14/1.0 batches a unit is the ideal); batches/unit over
# the last two thirds of 3000. Run with python3 (numpy); the script follows its output.
# sd 0.0 k=1 14.00 k=2 14.00 k=3 14.00 k=4 14.00 k=6 14.00 k=8 14.00  ideal 14.00
# sd 0.05 k=1 13.45 k=2 13.99 k=3 13.99 k=4 13.99 k=6 13.99 k=8 13.99  ideal 14.00
# sd 0.1 k=1 12.73 k=2 13.82 k=3 13.93 k=4 13.93 k=6 13.93 k=8 13.93  ideal 14.00
# sd 0.2 k=1 11.40 k=2 13.35 k=3 13.63 k=4 13.79 k=6 13.85 k=8 13.85  ideal 14.00
import numpy as np
def sim(n=14, k=2, mean=1.0, sd=0.1, step=0.054, N=3000, seed=0):
    rng=np.random.default_rng(seed)
    # worker queues: list of task ids; worker free time
    from collections import deque
    q=[deque() for _ in range(n)]; wfree=[0.0]*n; done={}
    def dispatch(i,t):
        w=i%n; q[w].append((i,t))
    # process: we compute completion times lazily: worker processes FIFO, start=max(free, dispatch time)
    for i in range(k*n): dispatch(i,0.0)
    def complete(i):
        # ensure batch i is computed
        w=i%n
        while i not in done:
            j,td=q[w].popleft()
            start=max(wfree[w],td); dur=max(0.05,rng.normal(mean,sd))
            wfree[w]=start+dur; done[j]=wfree[w]
        return done[i]
    t=0.0; times=[]
    for i in range(N):
        ready=complete(i)
        t=max(t,ready)  # consumer waits
        times.append(t)
        dispatch(i+k*n, t)
        t+=step
    times=np.array(times); a,b=N//3,N
    return (b-a)*1.0/(times[b-1]-times[a])
for sd in (0.0,0.05,0.1,0.2):
    print("sd",sd, " ".join("k=%d %.2f"%(k,sim(k=k,sd=sd)) for k in (1,2,3,4,6,8)), " ideal %.2f"%(14/1.0))
