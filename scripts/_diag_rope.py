import torch
from flashrec.kernels.qk_rope_kv import qk_norm_rope_store_ref, qk_norm_rope_store_triton, build_cos_sin
torch.manual_seed(0)
t,hq,hkv,d=33,16,8,128
buf=torch.randn(t,(hq+2*hkv)*d,device="cuda").bfloat16()
pos=torch.randint(0,4000,(t,),device="cuda")
cs=build_cos_sin(8192,d,1e6,device="cuda")
a=buf.clone(); b=buf.clone()
qk_norm_rope_store_triton(a,hq,hkv,d,pos,cs,None,None,1e-6,None,None,None)
qk_norm_rope_store_ref(b,hq,hkv,d,pos,cs,None,None,1e-6,None,None,None)
diff=(a.float()-b.float()).abs()
print("frac differ", (diff>0).float().mean().item(), "max", diff.max().item())
x=torch.randn(1000,device="cuda"); print("bf16 cast check", (x.bfloat16().float()-x).abs().max().item())
idx=(diff>0).nonzero()[:5]; print(idx, a[idx[:,0],idx[:,1]], b[idx[:,0],idx[:,1]])
