#include "serve/live_page.h"

#include "launcher/gallery.h"

namespace dp::serve {

// The script fetches /v1/jobs, then the records of the latest jobs that made images, and fetches
// each image with the key as a blob (an <img src> cannot send a header). When a refresh has drawn
// every image it marks the body with data-items, data-images and data-images-loaded, as the
// gallery's pages do, for automated checks.
std::string live_page_html(const std::string& model) {
    return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
           "<title>dp-launch serve</title>\n<style>\n" +
           launcher::gallery_style() +
           "table{border-collapse:collapse;background:#fff;margin-bottom:1rem}"
           "td,th{padding:.25rem .6rem;border-bottom:1px solid #ddd;font-size:.85rem;text-align:left}\n"
           "</style>\n</head>\n<body>\n<h1>dp-launch serve</h1>\n<div class=\"summary\">model " +
           launcher::html_escape(model) +
           " &middot; <span id=\"status\">loading</span></div>\n"
           "<h2>Queue</h2>\n<table id=\"jobs\"><thead><tr><th>job</th><th>kind</th><th>state</th>"
           "<th>images</th><th>place</th></tr></thead><tbody></tbody></table>\n"
           "<h2>Latest images</h2>\n<div class=\"grid\" id=\"images\"></div>\n"
           "<script>\n"
           "(function(){\n"
           "var key=new URLSearchParams(location.search).get('key');\n"
           "var opts=key?{headers:{'Authorization':'Bearer '+key}}:{};\n"
           "var blobs={};\n"
           "function get(u){return fetch(u,opts).then(function(r){if(!r.ok)throw new Error(u+': '+r.status);"
           "return r;});}\n"
           "function text(t){var s=document.createElement('span');s.textContent=t;return s;}\n"
           "function cell(row,t){var td=document.createElement('td');td.appendChild(text(String(t)));"
           "row.appendChild(td);}\n"
           "function image(url){if(blobs[url])return Promise.resolve(blobs[url]);"
           "return get(url).then(function(r){return r.blob();}).then(function(b){"
           "blobs[url]=URL.createObjectURL(b);return blobs[url];});}\n"
           "function card(job,r){var f=document.createElement('figure');f.className='item';"
           "f.style.margin='0';var img=document.createElement('img');img.alt=r.prompt||'';"
           "var p=document.createElement('div');p.className='prompt';p.textContent=r.prompt||'';"
           "var m=document.createElement('div');m.className='meta';m.textContent=job+' \\u00b7 seed '+r.seed;"
           "f.appendChild(img);f.appendChild(p);f.appendChild(m);"
           "var url='/v1/jobs/'+job+'/images/'+encodeURIComponent(r.file);"
           "return {el:f,done:image(url).then(function(u){return new Promise(function(ok){"
           "img.onload=ok;img.onerror=ok;img.src=u;});})};}\n"
           "function refresh(){get('/v1/jobs').then(function(r){return r.json();}).then(function(list){\n"
           "var body=document.querySelector('#jobs tbody');body.textContent='';\n"
           "var queued=0,latest=[];\n"
           "list.data.forEach(function(j){var row=document.createElement('tr');row.dataset.state=j.state;"
           "cell(row,j.id);cell(row,j.kind);cell(row,j.state);cell(row,j.images_done+' / '+j.images);"
           "cell(row,j.queue_position===undefined?'':j.queue_position);body.appendChild(row);"
           "if(j.state==='queued')queued++;if(j.images_done>0&&latest.length<4)latest.push(j.id);});\n"
           "document.getElementById('status').textContent=list.data.length+' job(s), '+queued+' queued';\n"
           "return Promise.all(latest.map(function(id){return get('/v1/jobs/'+id).then(function(r){"
           "return r.json();});}));}).then(function(jobs){\n"
           "var grid=document.getElementById('images'),cards=[];\n"
           "jobs.forEach(function(j){j.records.forEach(function(r){if(r.status==='ok'&&cards.length<48)"
           "cards.push(card(j.id,r));});});\n"
           "grid.textContent='';cards.forEach(function(c){grid.appendChild(c.el);});\n"
           "return Promise.all(cards.map(function(c){return c.done;}));}).then(function(){\n"
           "var i=document.images,n=0;for(var k=0;k<i.length;k++)if(i[k].complete&&i[k].naturalWidth>0)n++;\n"
           "document.body.dataset.imagesLoaded=n;document.body.dataset.images=i.length;"
           "document.body.dataset.items=document.querySelectorAll('.item').length;"
           "document.body.dataset.jobs=document.querySelectorAll('#jobs tbody tr').length;\n"
           "}).catch(function(e){document.getElementById('status').textContent=String(e);});}\n"
           "refresh();setInterval(refresh,2000);\n"
           "})();\n"
           "</script>\n</body>\n</html>\n";
}

}  // namespace dp::serve
