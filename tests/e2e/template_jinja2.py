#!/usr/bin/env python3
"""template_jinja2.py - differential test of `lmserv template` against the
Python jinja2 package set up the way Hugging Face transformers renders chat
templates (sandboxed environment, trim_blocks, lstrip_blocks, loop controls,
a tojson that keeps non-ASCII and key order, raise_exception, a fixed
strftime_now). Every template of the shared test data is rendered for more
conversations than the golden files hold (tool definitions and tool calls,
arguments as objects and as strings, reasoning, content parts, empty and
non-ASCII text) with and without the generation prompt; lmserv must print
the same bytes, or fail where jinja2 raises.

    LMSERV=build/lmserv LMS_TESTDATA=../shared/testdata python3 template_jinja2.py [-v]
"""
import json, os, shutil, subprocess, sys, tempfile
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
from jinja2.exceptions import TemplateError
TD=os.environ['LMS_TESTDATA']+'/templates'
LMS=os.environ['LMSERV']
CONV=os.path.join(tempfile.mkdtemp(prefix='lmserv-tpl.'),'c.json')
V=json.load(open(TD+'/variables.json'))
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def raise_exception(m): raise TemplateError(m)
env=ImmutableSandboxedEnvironment(trim_blocks=True,lstrip_blocks=True,extensions=[loopcontrols])
env.filters['tojson']=tojson
env.globals['raise_exception']=raise_exception
env.globals['strftime_now']=lambda f: '26 Nov 2026'
tool={"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{"city":{"type":"string","description":"City"}},"required":["city"]}}}
call={"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}
convs={
 'multi':[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"},{"role":"user","content":"Bye"},{"role":"assistant","content":"See you"}],
 'sys_only':[{"role":"system","content":"Sys."},{"role":"user","content":"x"}],
 'empty':[{"role":"user","content":""}],
 'ws':[{"role":"user","content":"  spaced  \n\n lines \t "}],
 'tool_call':[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","tool_calls":[call]},{"role":"tool","content":"{\"temp\": 20}","tool_call_id":"call_1","name":"get_weather"},{"role":"assistant","content":"It is 20."},{"role":"user","content":"thanks"}],
 'tool_call_none':[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":None,"tool_calls":[call]},{"role":"tool","content":"20C","tool_call_id":"call_1"}],
 'think':[{"role":"user","content":"q"},{"role":"assistant","content":"<think>\nhmm\n</think>\n\nanswer"},{"role":"user","content":"q2"}],
 'reasoning':[{"role":"user","content":"q"},{"role":"assistant","content":"answer","reasoning_content":"thought"},{"role":"user","content":"q2"}],
 'last_asst':[{"role":"user","content":"q"},{"role":"assistant","content":"partial"}],
 'quotes':[{"role":"user","content":"He said \"hi\" & <b>'x'</b> \\ back"}],
 'emoji':[{"role":"system","content":"日本語 😀"},{"role":"user","content":"ok 😀"}],
 'two_sys':[{"role":"system","content":"A"},{"role":"system","content":"B"},{"role":"user","content":"x"}],
 'call_str':[{"role":"user","content":"W?"},{"role":"assistant","content":None,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},{"role":"tool","content":"20C","tool_call_id":"c1"},{"role":"user","content":"ok"}],
 'ipython':[{"role":"user","content":"W?"},{"role":"assistant","tool_calls":[call]},{"role":"ipython","content":"20C"}],
 'two_calls':[{"role":"user","content":"W?"},{"role":"assistant","content":"Let me check.","tool_calls":[call,{"id":"c2","type":"function","function":{"name":"get_time","arguments":{"tz":"CET","n":3,"f":1.5,"b":True,"z":None,"l":[1,"a"]}}}]},{"role":"tool","content":"20C"},{"role":"tool","content":"noon"}],
 'num_content':[{"role":"user","content":"1"},{"role":"assistant","content":"2"},{"role":"user","content":"3"}],
 'parts':[{"role":"user","content":[{"type":"text","text":"part one"},{"type":"text","text":"part two"}]}],
}
def render(src, msgs, tools, agp, bos, eos):
    vars={'messages':msgs,'add_generation_prompt':agp}
    if tools is not None: vars['tools']=tools
    if bos is not None: vars['bos_token']=bos
    if eos is not None: vars['eos_token']=eos
    try: return ('ok', env.from_string(src).render(**vars))
    except TemplateError as e: return ('err', str(e))
    except Exception as e: return ('exc', repr(e))
fails=0; total=0
for name,t in V['templates'].items():
    src=open(TD+'/'+t['file']).read()
    for cname,msgs in convs.items():
        for tools in (None,[tool]):
            for agp in (True,False):
                exp=render(src,msgs,tools,agp,t['bos_token'],t['eos_token'])
                if exp[0]=='exc': continue
                total+=1
                json.dump({'messages':msgs,**({'tools':tools} if tools else {})},open(CONV,'w'))
                cmd=[LMS,'template','--template',TD+'/'+t['file'],'--messages',CONV,'--now-text','26 Nov 2026']
                if not agp: cmd.append('--no-generation-prompt')
                if t['bos_token'] is not None: cmd+=['--bos-token',t['bos_token']]
                if t['eos_token'] is not None: cmd+=['--eos-token',t['eos_token']]
                r=subprocess.run(cmd,capture_output=True)
                got=('ok',r.stdout.decode()) if r.returncode==0 else ('err',r.stderr.decode().strip())
                good = got==exp if exp[0]=='ok' else got[0]=='err'
                if not good:
                    fails+=1
                    print(f'FAIL {name} {cname} tools={tools is not None} agp={agp}')
                    if '-v' in sys.argv:
                        print(' exp:',repr(exp[1][-400:])); print(' got:',repr(got[1][-400:]))
shutil.rmtree(os.path.dirname(CONV), ignore_errors=True)
print(f'{total-fails}/{total} renders match jinja2')
sys.exit(1 if fails or total==0 else 0)
